"""Summary statistics of one numeric column of a CSV file under /data."""

import csv
import statistics


def main(path: str, column: str = "units", group_by: str | None = None) -> dict:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return {"rows": 0}
    if column not in rows[0]:
        raise KeyError(f"no column {column!r}; columns are {list(rows[0])}")

    def summary(values: list[float]) -> dict:
        return {
            "count": len(values),
            "sum": sum(values),
            "mean": statistics.fmean(values),
            "median": statistics.median(values),
            "min": min(values),
            "max": max(values),
        }

    result = {"rows": len(rows), "column": column, "all": summary([float(r[column]) for r in rows])}
    if group_by:
        groups: dict[str, list[float]] = {}
        for row in rows:
            groups.setdefault(row[group_by], []).append(float(row[column]))
        result["by_" + group_by] = {key: summary(vals) for key, vals in sorted(groups.items())}
    return result
