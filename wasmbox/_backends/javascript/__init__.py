"""The JavaScript runtime: QuickJS-NG, pre-initialized, one fresh instance per call."""
