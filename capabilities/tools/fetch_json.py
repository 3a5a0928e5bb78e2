"""Fetch a URL through the host's http.fetch and return its JSON body."""

import json

from wasmbox_guest import call_host


def main(url: str) -> object:
    reply = call_host("http.fetch", url=url, headers={"Accept": "application/json"})
    if reply["status"] != 200:
        raise RuntimeError(f"{url}: HTTP {reply['status']}")
    return json.loads(reply["body"])
