;; Imports a function WASI preview1 does not have.
(module
  (import "wasi_snapshot_preview1" "no_such_fn" (func))
  (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64) (i64.const 0)))
