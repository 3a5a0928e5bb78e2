;; Never returns: an infinite loop. Stopped by fuel or by the deadline.
(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func $alloc (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (local.get $ptr))
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (loop $forever (br $forever))
    (i64.const 0)))
