;; A WASI command that calls host function "host.fn" with an empty map and exits 0.
(module
  (import "wasmbox" "host.fn" (func $host (param i32 i32) (result i64)))
  (memory (export "memory") 1)
  (data (i32.const 16) "\80")
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "_start") (drop (call $host (i32.const 16) (i32.const 1)))))
