;; Declares 512 MiB of initial memory: more than any test manifest allows.
(module
  (memory (export "memory") 8192)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64) (i64.const 0)))
