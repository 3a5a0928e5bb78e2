;; Sends its args to host function "http.fetch" and returns the host's reply as its own result,
;; so {"ok": v} from the host becomes the call's value and {"error": m} its guest error.
(module
  (import "wasmbox" "http.fetch" (func $host (param i32 i32) (result i64)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func $alloc (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (if (i32.eq (memory.grow (i32.add (i32.shr_u (local.get $len) (i32.const 16)) (i32.const 1))) (i32.const -1))
        (then unreachable))))
    (local.get $ptr))
  (func (export "wasmbox_call") (param $ptr i32) (param $len i32) (result i64)
    (call $host (local.get $ptr) (local.get $len))))
