;; Writes "spam\n" to stdout until a write fails, then returns {"ok": null}.
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func $alloc (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (local.get $ptr))
  (data (i32.const 100) "spam\n")
  (data (i32.const 16) "\81\a2ok\c0")
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (i32.store (i32.const 0) (i32.const 100))
    (i32.store (i32.const 4) (i32.const 5))
    (loop $again
      (br_if $again (i32.eqz (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 5))))
