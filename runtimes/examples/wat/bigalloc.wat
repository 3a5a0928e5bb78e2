;; Asks for 1 GiB at once; when that fails, reports it as its own error ("out of memory").
(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func $alloc (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (local.get $ptr))
  (data (i32.const 16) "\81\a5error\adout of memory")
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (if (i32.eq (memory.grow (i32.const 16384)) (i32.const -1))
      (then (return (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 21)))))
    (i64.const 0)))
