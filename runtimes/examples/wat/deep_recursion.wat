;; Recurses without end: the stack limit traps it.
(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func $alloc (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (local.get $ptr))
  (func $down (param i32) (result i32) (i32.add (call $down (local.get 0)) (i32.const 1)))
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (i64.extend_i32_u (call $down (i32.const 0)))))
