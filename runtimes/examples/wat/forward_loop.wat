;; Calls host function "host.fn" 1000 times with its args, then returns the last reply.
(module
  (import "wasmbox" "host.fn" (func $host (param i32 i32) (result i64)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func $alloc (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (local.get $ptr))
  (func (export "wasmbox_call") (param $ptr i32) (param $len i32) (result i64)
    (local $i i32) (local $r i64)
    (loop $again
      (local.set $r (call $host (local.get $ptr) (local.get $len)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $again (i32.lt_u (local.get $i) (i32.const 1000))))
    (local.get $r)))
