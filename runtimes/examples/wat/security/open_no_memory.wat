;; A WASI command that calls path_open without exporting its memory: WASI cannot read the path.
(module
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (memory 1)
  (data (i32.const 16) "inside.txt")
  (func (export "_start")
    (drop (call $path_open (i32.const 3) (i32.const 0) (i32.const 16) (i32.const 10) (i32.const 0)
                           (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 8)))))
