;; wasmbox_call returns 8 i64s instead of one: must be refused at load, never called.
(module
  (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64 i64 i64 i64 i64 i64 i64 i64)
    (i64.const 1) (i64.const 2) (i64.const 3) (i64.const 4)
    (i64.const 5) (i64.const 6) (i64.const 7) (i64.const 8)))
