;; Exports _initialize with a parameter: must be refused at load.
(module
  (memory (export "memory") 1)
  (func (export "_initialize") (param i32))
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64) (i64.const 0)))
