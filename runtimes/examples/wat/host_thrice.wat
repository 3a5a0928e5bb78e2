;; Calls host function "host.fn" three times in straight-line code (no loop, no call between
;; that would check fuel), then returns the last reply.
(module
  (import "wasmbox" "host.fn" (func $host (param i32 i32) (result i64)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (local.get $ptr))
  (func (export "wasmbox_call") (param $ptr i32) (param $len i32) (result i64)
    (drop (call $host (local.get $ptr) (local.get $len)))
    (drop (call $host (local.get $ptr) (local.get $len)))
    (call $host (local.get $ptr) (local.get $len))))
