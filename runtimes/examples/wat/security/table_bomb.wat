;; Grows a table by 1000 entries at a time until growth fails, then traps.
(module
  (table $t 1 funcref)
  (memory (export "memory") 1)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64)
    (loop $more
      (br_if $more (i32.ne (table.grow $t (ref.null func) (i32.const 1000)) (i32.const -1))))
    unreachable))
