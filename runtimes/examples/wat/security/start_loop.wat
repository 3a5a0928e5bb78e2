;; Spins forever in its start function, before the host gets to call anything.
(module
  (memory (export "memory") 1)
  (func $spin (loop $again (br $again)))
  (start $spin)
  (func (export "wasmbox_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "wasmbox_call") (param i32 i32) (result i64) (i64.const 0)))
