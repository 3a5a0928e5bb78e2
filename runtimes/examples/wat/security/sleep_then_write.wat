;; A WASI command that asks poll_oneoff for a 10 s sleep, then writes "woke" to stdout: cut at
;; the deadline, it must not get to write.
(module
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 32) "woke\n")
  (data (i32.const 64) "\20\00\00\00\05\00\00\00")  ;; one iovec: 5 bytes at 32
  (func (export "_start")
    ;; subscription at 256: userdata 7, tag 0 (clock), id 1 (monotonic), timeout 10 s, flags 0
    (i64.store (i32.const 256) (i64.const 7))
    (i32.store8 (i32.const 264) (i32.const 0))
    (i32.store (i32.const 272) (i32.const 1))
    (i64.store (i32.const 280) (i64.const 10000000000))
    (i64.store (i32.const 288) (i64.const 0))
    (i32.store16 (i32.const 296) (i32.const 0))
    (drop (call $poll (i32.const 256) (i32.const 512) (i32.const 1) (i32.const 600)))
    (drop (call $fd_write (i32.const 1) (i32.const 64) (i32.const 1) (i32.const 100)))))
