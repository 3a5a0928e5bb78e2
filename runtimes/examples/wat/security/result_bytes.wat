;; Returns whatever the call's args say, as raw bytes: args {"bytes": bin, "ptr": int?, "len": int?}
;; are NOT parsed; instead the host test writes the reply bytes into the args map and this
;; module returns (ptr << 32) | len from the two i32 at the end of the args payload.
;; Layout the test sends: msgpack map whose last 8 bytes are ptr (i32 LE) and len (i32 LE),
;; so any pointer and length (out of bounds, wrapping, huge) can be tried.
(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (local.get $ptr))
  (func (export "wasmbox_call") (param $ptr i32) (param $len i32) (result i64)
    (local $end i32)
    (local.set $end (i32.add (local.get $ptr) (local.get $len)))
    (i64.or
      (i64.shl (i64.extend_i32_u (i32.load (i32.sub (local.get $end) (i32.const 8)))) (i64.const 32))
      (i64.extend_i32_u (i32.load (i32.sub (local.get $end) (i32.const 4)))))))
