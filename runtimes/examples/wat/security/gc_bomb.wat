;; Allocates 8 MB GC arrays and keeps them all (in a table), so none can be collected.
(module
  (type $a (array (mut i64)))
  (table $keep 1000 (ref null $a))
  (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (local $i i32)
    (loop $more
      (table.set $keep (local.get $i) (array.new_default $a (i32.const 1000000)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $more (i32.lt_u (local.get $i) (i32.const 1000))))
    (i64.const 0)))
