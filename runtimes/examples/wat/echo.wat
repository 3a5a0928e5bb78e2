;; wasmbox ABI v1 in a few lines: the result is {"ok": <the args map>}.
(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func $alloc (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    ;; grow when the bump pointer passes the end of memory
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow
        (i32.add (i32.div_u (i32.sub (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
                            (i32.const 65536)) (i32.const 1))))))
    (local.get $ptr))
  (func (export "wasmbox_call") (param $ptr i32) (param $len i32) (result i64)
    (local $out i32)
    (local.set $out (call $alloc (i32.add (local.get $len) (i32.const 4))))
    ;; 0x81 = map of 1, 0xa2 "ok" = str of 2
    (i32.store8 (local.get $out) (i32.const 0x81))
    (i32.store8 (i32.add (local.get $out) (i32.const 1)) (i32.const 0xa2))
    (i32.store8 (i32.add (local.get $out) (i32.const 2)) (i32.const 0x6f))
    (i32.store8 (i32.add (local.get $out) (i32.const 3)) (i32.const 0x6b))
    (memory.copy (i32.add (local.get $out) (i32.const 4)) (local.get $ptr) (local.get $len))
    (i64.or
      (i64.shl (i64.extend_i32_u (local.get $out)) (i64.const 32))
      (i64.extend_i32_u (i32.add (local.get $len) (i32.const 4))))))
