;; Claims a 1 MiB result (memory is 17 pages, so the bytes exist): past any sane output cap.
(module
  (memory (export "memory") 17)
  (global $heap (mut i32) (i32.const 1024))
  (func (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (local.get $ptr))
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (i64.or (i64.shl (i64.const 65536) (i64.const 32)) (i64.const 1048576))))
