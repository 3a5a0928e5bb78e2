;; Replies with whatever bytes it is given, for fuzzing the host's reading of results.
;; Call it with {"r": <bin>}: those bytes are returned as the raw reply (not wrapped in
;; {"ok": ...}). Call it with {"p": <8-byte bin>}: those bytes, little-endian, are returned as
;; the packed (ptr << 32) | len itself, so the host reads wherever they point.
(module
  (memory (export "memory") 1)
  (global $heap (mut i32) (i32.const 1024))
  (func $alloc (export "wasmbox_alloc") (param $len i32) (result i32)
    (local $ptr i32)
    (local.set $ptr (global.get $heap))
    (global.set $heap (i32.add (local.get $ptr) (local.get $len)))
    (if (i32.gt_u (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow
        (i32.add (i32.div_u (i32.sub (global.get $heap) (i32.mul (memory.size) (i32.const 65536)))
                            (i32.const 65536)) (i32.const 1))))))
    (local.get $ptr))
  ;; The args are 0x81 (map of 1), 0xa1 <key> (a 1-byte str), then a bin: 0xc4 n8 | 0xc5 n16 | 0xc6 n32.
  (func (export "wasmbox_call") (param $ptr i32) (param $len i32) (result i64)
    (local $key i32) (local $tag i32) (local $data i32) (local $n i32)
    (local.set $key (i32.load8_u offset=2 (local.get $ptr)))
    (local.set $tag (i32.load8_u offset=3 (local.get $ptr)))
    (if (i32.eq (local.get $tag) (i32.const 0xc4))
      (then
        (local.set $n (i32.load8_u offset=4 (local.get $ptr)))
        (local.set $data (i32.add (local.get $ptr) (i32.const 5)))))
    (if (i32.eq (local.get $tag) (i32.const 0xc5))
      (then
        (local.set $n (i32.or (i32.shl (i32.load8_u offset=4 (local.get $ptr)) (i32.const 8))
                              (i32.load8_u offset=5 (local.get $ptr))))
        (local.set $data (i32.add (local.get $ptr) (i32.const 6)))))
    (if (i32.eq (local.get $tag) (i32.const 0xc6))
      (then
        (local.set $n
          (i32.or
            (i32.or (i32.shl (i32.load8_u offset=4 (local.get $ptr)) (i32.const 24))
                    (i32.shl (i32.load8_u offset=5 (local.get $ptr)) (i32.const 16)))
            (i32.or (i32.shl (i32.load8_u offset=6 (local.get $ptr)) (i32.const 8))
                    (i32.load8_u offset=7 (local.get $ptr)))))
        (local.set $data (i32.add (local.get $ptr) (i32.const 8)))))
    (if (i32.eq (local.get $key) (i32.const 0x70))  ;; "p"
      (then (return (i64.load (local.get $data)))))
    (i64.or (i64.shl (i64.extend_i32_u (local.get $data)) (i64.const 32))
            (i64.extend_i32_u (local.get $n)))))
