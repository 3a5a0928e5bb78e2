;; Throws a wasm exception that nothing catches.
(module
  (tag $oops)
  (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64) (throw $oops)))
