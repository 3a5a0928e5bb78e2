;; Declares a table of 10 million entries (80 MB of host memory if it were allowed).
(module
  (table 10000000 funcref)
  (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64) (i64.const 0)))
