;; Writes 4 KiB blocks to stderr forever, ignoring every error.
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 8192))
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (memory.fill (i32.const 256) (i32.const 0x45) (i32.const 4096))
    (i32.store (i32.const 0) (i32.const 256))
    (i32.store (i32.const 4) (i32.const 4096))
    (loop $again
      (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
      (br $again))
    (i64.const 0)))
