;; Asks for a socket-creating import that WASI preview1 does not have (WasmEdge's sock_open).
(module
  (import "wasi_snapshot_preview1" "sock_open" (func $sock_open (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64) (i64.const 0)))
