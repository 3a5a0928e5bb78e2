;; Tries to write into, climb out of and list the hidden root a core module's WASI world gets
;; at / (descriptor 3 when the manifest grants nothing and there is no scratch space). Writes
;; to stdout one byte per attempt, the errno it got, in this order: create a file; mkdir;
;; open ".." as a directory; open "/" itself; unlink; rename; hard link; set times by path;
;; set the directory's own times; move the root onto stdin's descriptor 0 with fd_renumber;
;; create a file through 0; list 0 with fd_readdir. Then the raw listing (its dirents).
(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_create_directory" (func $mkdir (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_unlink_file" (func $unlink (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_rename"
    (func $rename (param i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_link"
    (func $link (param i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_filestat_set_times"
    (func $path_times (param i32 i32 i32 i32 i64 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_filestat_set_times"
    (func $fd_times (param i32 i64 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_renumber" (func $fd_renumber (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_readdir" (func $fd_readdir (param i32 i32 i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "pwned")
  (data (i32.const 32) "..")
  (data (i32.const 40) ".")
  ;; 256: the errnos, one byte each; 512: an iovec; 1024: the listing
  (func $record (param $at i32) (param $errno i32)
    (i32.store8 (i32.add (i32.const 256) (local.get $at)) (local.get $errno)))
  (func $create (param $fd i32) (result i32)
    ;; oflags 1 = O_CREAT; rights: fd_write (bit 6)
    (call $path_open (local.get $fd) (i32.const 0) (i32.const 16) (i32.const 5)
                     (i32.const 1) (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 8)))
  (func (export "_start")
    (call $record (i32.const 0) (call $create (i32.const 3)))
    (call $record (i32.const 1) (call $mkdir (i32.const 3) (i32.const 16) (i32.const 5)))
    ;; oflags 2 = O_DIRECTORY, rights: fd_readdir (bit 14)
    (call $record (i32.const 2) (call $path_open (i32.const 3) (i32.const 0) (i32.const 32) (i32.const 2)
                     (i32.const 2) (i64.const 16384) (i64.const 0) (i32.const 0) (i32.const 8)))
    (call $record (i32.const 3) (call $path_open (i32.const 3) (i32.const 0) (i32.const 40) (i32.const 1)
                     (i32.const 2) (i64.const 16384) (i64.const 0) (i32.const 0) (i32.const 8)))
    (call $record (i32.const 4) (call $unlink (i32.const 3) (i32.const 16) (i32.const 5)))
    (call $record (i32.const 5) (call $rename (i32.const 3) (i32.const 16) (i32.const 5)
                                              (i32.const 3) (i32.const 32) (i32.const 2)))
    (call $record (i32.const 6) (call $link (i32.const 3) (i32.const 0) (i32.const 40) (i32.const 1)
                                            (i32.const 3) (i32.const 16) (i32.const 5)))
    ;; fstflags 5 = ATIM | MTIM, both to time 0
    (call $record (i32.const 7) (call $path_times (i32.const 3) (i32.const 0) (i32.const 40) (i32.const 1)
                                                  (i64.const 0) (i64.const 0) (i32.const 5)))
    (call $record (i32.const 8) (call $fd_times (i32.const 3) (i64.const 0) (i64.const 0) (i32.const 5)))
    (call $record (i32.const 9) (call $fd_renumber (i32.const 3) (i32.const 0)))
    (call $record (i32.const 10) (call $create (i32.const 0)))
    (call $record (i32.const 11)
      (call $fd_readdir (i32.const 0) (i32.const 1024) (i32.const 2048) (i64.const 0) (i32.const 12)))
    (i32.store (i32.const 512) (i32.const 256))
    (i32.store (i32.const 516) (i32.const 12))
    (i32.store (i32.const 520) (i32.const 1024))
    (i32.store (i32.const 524) (i32.load (i32.const 12)))
    (drop (call $fd_write (i32.const 1) (i32.const 512) (i32.const 2) (i32.const 8)))))
