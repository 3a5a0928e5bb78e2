;; Tries to hold more descriptors than the per-call cap: opens until refused, closes stdin and
;; stdout (not host descriptors) and opens again, moves its last file onto stderr's slot with
;; fd_renumber (which frees the file's own number) and opens again, then closes it under its
;; new number and opens again: the cap allows exactly one more. Exits with how many opens succeeded, less 100
;; (WASI exit codes stop at 125).
(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $fd_close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_renumber" (func $fd_renumber (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "inside.txt")
  (global $opened (mut i32) (i32.const 0))
  (func $drain
    (loop $more
      (if (i32.eqz (call $path_open (i32.const 3) (i32.const 0) (i32.const 16) (i32.const 10)
                                    (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 8)))
        (then (global.set $opened (i32.add (global.get $opened) (i32.const 1))) (br $more)))))
  (func (export "_start")
    (call $drain)
    (drop (call $fd_close (i32.const 0)))
    (drop (call $fd_close (i32.const 1)))
    (call $drain)
    ;; the last opened descriptor (its number is at 8) moved onto stderr's slot
    (drop (call $fd_renumber (i32.load (i32.const 8)) (i32.const 2)))
    (call $drain)
    ;; closing it there frees exactly one place (one more open), wherever it now lives
    (drop (call $fd_close (i32.const 2)))
    (call $drain)
    (call $proc_exit (i32.sub (global.get $opened) (i32.const 100)))))
