;; A WASI command that writes to stdout what it read from outside: the wall clock (8 bytes),
;; 8 random bytes, and up to 256 bytes of in.txt in its first preopen.
(module
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 400) "in.txt")
  ;; 0: the clock; 8: the random bytes; 16: the file; 300: an iovec; 320: the fd; 324: bytes read
  (func (export "_start")
    (drop (call $clock (i32.const 0) (i64.const 1) (i32.const 0)))
    (drop (call $random (i32.const 8) (i32.const 8)))
    (drop (call $open (i32.const 3) (i32.const 0) (i32.const 400) (i32.const 6) (i32.const 0)
      (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 320)))
    (i32.store (i32.const 300) (i32.const 16))
    (i32.store (i32.const 304) (i32.const 256))
    (drop (call $read (i32.load (i32.const 320)) (i32.const 300) (i32.const 1) (i32.const 324)))
    (i32.store (i32.const 300) (i32.const 0))
    (i32.store (i32.const 304) (i32.add (i32.const 16) (i32.load (i32.const 324))))
    (drop (call $write (i32.const 1) (i32.const 300) (i32.const 1) (i32.const 328)))))
