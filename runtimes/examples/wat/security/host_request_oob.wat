;; Calls host function "host.fn" with a request that runs past the end of its memory.
(module
  (import "wasmbox" "host.fn" (func $host (param i32 i32) (result i64)))
  (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (call $host (i32.const 65000) (i32.const 0x7fffffff))))
