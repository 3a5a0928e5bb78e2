;; Opens a file from its start section (while it is being instantiated) and again from _start
;; with rights WASI cannot represent (a negative i64): the second open traps in Wasmtime's WASI,
;; and nothing after it may run (the write to stdout must not happen).
(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "inside.txt")
  (data (i32.const 32) "ran after the trap\n")
  (data (i32.const 64) "\20\00\00\00\13\00\00\00")  ;; one iovec: 19 bytes at 32
  (global $first (mut i32) (i32.const -1))
  (func $open (param $rights i64) (result i32)
    (call $path_open (i32.const 3) (i32.const 0) (i32.const 16) (i32.const 10) (i32.const 0)
                     (local.get $rights) (i64.const 0) (i32.const 0) (i32.const 8)))
  (func $at_start (global.set $first (call $open (i64.const 2))))
  (start $at_start)
  (func (export "_start")
    ;; exit 3 unless the start section's open succeeded
    (if (global.get $first) (then (call $proc_exit (i32.const 3))))
    (drop (call $open (i64.const -1)))
    (drop (call $fd_write (i32.const 1) (i32.const 64) (i32.const 1) (i32.const 100)))))
