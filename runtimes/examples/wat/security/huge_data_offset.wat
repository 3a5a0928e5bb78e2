;; Initializes memory at an offset far past its size.
(module
  (memory (export "memory") 1)
  (data (i32.const 0xffff0000) "x")
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64) (i64.const 0)))
