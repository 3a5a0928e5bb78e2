;; Asks WASI poll_oneoff for a relative clock sleep of 10 s (as sleep(10) in C does), then
;; returns {"ok": null}. The args map's length byte is ignored.
(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (local.get $ptr))
  (data (i32.const 16) "\81\a2ok\c0")
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    ;; subscription at 256: userdata 7, tag 0 (clock), id 1 (monotonic), timeout 10 s, flags 0
    (i64.store (i32.const 256) (i64.const 7))
    (i32.store8 (i32.const 264) (i32.const 0))
    (i32.store (i32.const 272) (i32.const 1))
    (i64.store (i32.const 280) (i64.const 10000000000))
    (i64.store (i32.const 288) (i64.const 0))
    (i32.store16 (i32.const 296) (i32.const 0))
    (drop (call $poll (i32.const 256) (i32.const 512) (i32.const 1) (i32.const 600)))
    (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 4))))
