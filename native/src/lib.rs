//! `wasmbox._native`: a spike of wasmbox's engine layer on the `wasmtime` crate itself.
//!
//! Just enough for the two calls the spike measures (bench/native_spike.py): a trivial core
//! call under every limit wasmbox sets (`CoreTool`), and a fresh call of the CPython runtime
//! component (`PythonRuntime`). Each call runs with the GIL released from the new Store to the
//! reply; the epoch ticker that enforces deadlines is a Rust thread.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use wasmtime::component::{self, ResourceTable};
use wasmtime::{
    Config, Enabled, InstanceAllocationStrategy, Module, ModuleExport, OptLevel,
    PoolingAllocationConfig, Store, StoreLimits, StoreLimitsBuilder, Trap,
};
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

create_exception!(_native, CallFailed, PyException, "A call ended in an error: args are (kind, message).");

const MAX_MEMORY: usize = 4 << 30; // the wasm32 address space

/// The shared Wasmtime engine, set up as `wasmbox._engine.make_engine` sets up its own (fuel,
/// epoch interruption, the same pooling allocator), plus `PAGEMAP_SCAN` resets where the
/// kernel has them.
#[pyclass(frozen)]
struct Engine {
    engine: wasmtime::Engine,
    tick_s: f64,
    stop: Arc<AtomicBool>,
    pagemap_scan: bool,
}

#[pymethods]
impl Engine {
    #[new]
    #[pyo3(signature = (*, max_wasm_stack=512 * 1024, epoch_tick_s=0.005, pooling=true, pool_slots=512,
                        pool_components=64, pool_keep_resident=32 << 20, pool_table_keep_resident=0,
                        pagemap_scan=true))]
    fn new(
        max_wasm_stack: usize,
        epoch_tick_s: f64,
        pooling: bool,
        pool_slots: u32,
        pool_components: u32,
        pool_keep_resident: usize,
        pool_table_keep_resident: usize,
        pagemap_scan: bool,
    ) -> PyResult<Self> {
        let mut config = Config::new();
        config.consume_fuel(true);
        config.epoch_interruption(true);
        config.max_wasm_stack(max_wasm_stack);
        config.cranelift_opt_level(OptLevel::Speed);
        if pooling {
            let mut pool = PoolingAllocationConfig::new();
            pool.total_core_instances(4 * pool_slots) // a Python call uses ~14 core instances
                .total_memories(pool_slots)
                .total_tables(2 * pool_slots)
                .total_component_instances(pool_components)
                .total_stacks(0)
                .max_memory_size(MAX_MEMORY)
                .max_core_instances_per_component(64)
                .max_memories_per_component(16)
                .max_tables_per_component(32)
                .max_core_instance_size(16 << 20)
                .max_component_instance_size(16 << 20)
                .table_elements(200_000)
                .linear_memory_keep_resident(pool_keep_resident)
                .table_keep_resident(pool_table_keep_resident)
                .pagemap_scan(if pagemap_scan { Enabled::Auto } else { Enabled::No });
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = wasmtime::Engine::new(&config).map_err(failed)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ticking, flag) = (engine.clone(), stop.clone());
        let tick = Duration::from_secs_f64(epoch_tick_s);
        thread::Builder::new()
            .name("wasmbox-epoch".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    thread::sleep(tick);
                    ticking.increment_epoch();
                }
            })
            .map_err(|e| CallFailed::new_err(("host_error", e.to_string())))?;
        let scans = pooling && pagemap_scan && PoolingAllocationConfig::is_pagemap_scan_available();
        Ok(Engine { engine, tick_s: epoch_tick_s, stop, pagemap_scan: scans })
    }

    /// Whether pool slots are reset with `PAGEMAP_SCAN` (asked for, and the kernel has it).
    #[getter]
    fn pagemap_scan(&self) -> bool {
        self.pagemap_scan
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Engine {
    /// Epoch ticks to allow for `timeout_s`, as `EpochTicker.ticks` counts them.
    fn ticks(&self, timeout_s: f64) -> u64 {
        ((timeout_s / self.tick_s).ceil() as u64).max(1) + 1
    }
}

/// One call's limits, as `wasmbox.Limits` has them.
#[derive(Clone, Copy, PartialEq)]
struct Limits {
    fuel: u64,
    memory: usize,
    timeout: f64,
    output: usize,
}

/// A loaded ABI v1 core module (no imports): `call` runs it in a fresh Store and instance
/// with fuel, a memory cap, store limits and an epoch deadline, as `ModuleRunner` does.
#[pyclass(frozen)]
struct CoreTool {
    engine: wasmtime::Engine,
    ticks: u64,
    limits: Limits,
    pre: wasmtime::InstancePre<StoreLimits>,
    memory: ModuleExport,
    alloc: ModuleExport,
    call: ModuleExport,
}

#[pymethods]
impl CoreTool {
    #[new]
    #[pyo3(signature = (engine, wasm, *, fuel=50_000_000, memory=64 << 20, timeout=2.0, output=64 << 10))]
    fn new(engine: &Engine, wasm: &[u8], fuel: u64, memory: usize, timeout: f64, output: usize) -> PyResult<Self> {
        let module = Module::new(&engine.engine, wasm).map_err(failed)?;
        let export = |name: &str| {
            module
                .get_export_index(name)
                .ok_or_else(|| CallFailed::new_err(("bad_module", format!("no export {name}"))))
        };
        let (memory_export, alloc, call) = (export("memory")?, export("wasmbox_alloc")?, export("wasmbox_call")?);
        let linker = wasmtime::Linker::new(&engine.engine);
        let pre = linker.instantiate_pre(&module).map_err(failed)?;
        Ok(CoreTool {
            engine: engine.engine.clone(),
            ticks: engine.ticks(timeout),
            limits: Limits { fuel, memory, timeout, output },
            pre,
            memory: memory_export,
            alloc,
            call,
        })
    }

    /// Call `wasmbox_call` with `args` (MessagePack); returns (reply, fuel used, memory size).
    /// Raises CallFailed(kind, message).
    fn call<'py>(&self, py: Python<'py>, args: &[u8]) -> PyResult<(Bound<'py, PyBytes>, u64, usize)> {
        let (reply, fuel, peak) = py.allow_threads(|| self.run(args)).map_err(into_py)?;
        Ok((PyBytes::new(py, &reply), fuel, peak))
    }
}

impl CoreTool {
    fn run(&self, args: &[u8]) -> Result<(Vec<u8>, u64, usize), (&'static str, String)> {
        let limits = StoreLimitsBuilder::new()
            .memory_size(self.limits.memory)
            .table_elements(100_000)
            .instances(2)
            .tables(8)
            .memories(1)
            .build();
        let mut store = Store::new(&self.engine, limits);
        store.limiter(|limits| limits);
        store.set_fuel(self.limits.fuel).map_err(classify)?;
        store.set_epoch_deadline(self.ticks);
        let instance = self.pre.instantiate(&mut store).map_err(classify)?;
        let get = |store: &mut Store<StoreLimits>, export: &ModuleExport| {
            instance.get_module_export(store, export).ok_or(("bad_module", "missing export".to_string()))
        };
        let memory = get(&mut store, &self.memory)?.into_memory().ok_or(bad("memory is not a memory"))?;
        let alloc = get(&mut store, &self.alloc)?.into_func().ok_or(bad("wasmbox_alloc is not a function"))?;
        let call = get(&mut store, &self.call)?.into_func().ok_or(bad("wasmbox_call is not a function"))?;
        let alloc = alloc.typed::<i32, i32>(&store).map_err(classify)?;
        let call = call.typed::<(i32, i32), i64>(&store).map_err(classify)?;
        let len = i32::try_from(args.len()).map_err(|_| ("invalid_arguments", "args too large".to_string()))?;
        let ptr = alloc.call(&mut store, len).map_err(classify)? as u32 as usize;
        if ptr == 0 || ptr + args.len() > memory.data_size(&store) {
            return Err(bad("wasmbox_alloc returned an invalid pointer"));
        }
        memory.data_mut(&mut store)[ptr..ptr + args.len()].copy_from_slice(args);
        let packed = call.call(&mut store, (ptr as i32, len)).map_err(classify)? as u64;
        let (rptr, rlen) = ((packed >> 32) as usize, (packed & 0xFFFF_FFFF) as usize);
        if rlen > self.limits.output {
            return Err(("output_limit", format!("result of {rlen} bytes exceeds the output cap")));
        }
        let data = memory.data(&store);
        let reply = data.get(rptr..rptr + rlen).ok_or(bad("result points outside the guest's memory"))?.to_vec();
        let fuel = self.limits.fuel - store.get_fuel().map_err(classify)?;
        Ok((reply, fuel, data.len()))
    }
}

/// What a Python call's Store holds: its WASI context and the store limits.
struct PyState {
    wasi: WasiCtx,
    table: ResourceTable,
    limits: StoreLimits,
}

impl WasiView for PyState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

/// The CPython runtime component: `call` sends one request to a fresh instance, with the
/// stdlib preopened read-only at /python and stdout/stderr captured up to the output cap.
/// `call-host` answers every name with an error reply (nothing is granted).
///
/// With `spare`, a Rust thread drops each call's Store after the call and makes the next
/// call's instance ahead of it (as wasmbox's housekeeper thread does, without the GIL): a call
/// that finds it ready only runs. A spare is made for the limits of the call before; a call
/// with other limits makes its own.
#[pyclass(frozen)]
struct PythonRuntime {
    inner: Arc<Inner>,
    keeper: Option<SyncSender<Job>>,
}

struct Inner {
    engine: wasmtime::Engine,
    tick_s: f64,
    pre: component::InstancePre<PyState>,
    run: component::ComponentExportIndex,
    stdlib: PathBuf,
    spare: Mutex<Option<Instance>>,
}

/// A Store and an instance for one call, not yet run.
struct Instance {
    store: Store<PyState>,
    run: component::Func,
    stdout: MemoryOutputPipe,
    stderr: MemoryOutputPipe,
    limits: Limits,
}

enum Job {
    Drop(Store<PyState>),
    Prepare(Limits),
}

type Reply = (Vec<u8>, Vec<u8>, Vec<u8>, u64);

#[pymethods]
impl PythonRuntime {
    /// Compiles `component_path` (or loads `compiled_path`, which is written when missing or
    /// made by another Wasmtime build).
    #[new]
    #[pyo3(signature = (engine, component_path, stdlib_dir, compiled_path=None, *, spare=false))]
    fn new(
        py: Python<'_>,
        engine: &Engine,
        component_path: PathBuf,
        stdlib_dir: PathBuf,
        compiled_path: Option<PathBuf>,
        spare: bool,
    ) -> PyResult<Self> {
        let wasm_engine = engine.engine.clone();
        let compiled = py
            .allow_threads(|| load_component(&wasm_engine, &component_path, compiled_path.as_deref()))
            .map_err(failed)?;
        let mut linker = component::Linker::<PyState>::new(&engine.engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).map_err(failed)?;
        linker
            .root()
            .func_wrap("call-host", |_store, (_name, _args): (String, Vec<u8>)| Ok((refusal(),)))
            .map_err(failed)?;
        let run = compiled
            .get_export_index(None, "run")
            .ok_or_else(|| CallFailed::new_err(("bad_module", "the component exports no `run`")))?;
        let pre = linker.instantiate_pre(&compiled).map_err(failed)?;
        let inner = Arc::new(Inner {
            engine: wasm_engine,
            tick_s: engine.tick_s,
            pre,
            run,
            stdlib: stdlib_dir,
            spare: Mutex::new(None),
        });
        let keeper = if spare {
            let (sender, jobs) = sync_channel::<Job>(4);
            let owner = inner.clone();
            thread::Builder::new()
                .name("wasmbox-python".into())
                .spawn(move || {
                    for job in jobs {  // ends when the PythonRuntime (the sender) is dropped
                        match job {
                            Job::Drop(store) => drop(store),
                            Job::Prepare(limits) => {
                                if owner.spare.lock().unwrap().is_none() {
                                    if let Ok(made) = owner.prepare(limits, &mut [0; 4]) {
                                        *owner.spare.lock().unwrap() = Some(made);
                                    }
                                }
                            }
                        }
                    }
                })
                .map_err(|e| CallFailed::new_err(("host_error", e.to_string())))?;
            Some(sender)
        } else {
            None
        };
        Ok(PythonRuntime { inner, keeper })
    }

    /// Run `request` (MessagePack) in a fresh instance; returns (response, stdout, stderr,
    /// fuel used). Raises CallFailed(kind, message).
    #[pyo3(signature = (request, *, fuel=50_000_000, memory=64 << 20, timeout=2.0, output=64 << 10))]
    fn call<'py>(
        &self,
        py: Python<'py>,
        request: &[u8],
        fuel: u64,
        memory: usize,
        timeout: f64,
        output: usize,
    ) -> PyResult<(Bound<'py, PyBytes>, Bound<'py, PyBytes>, Bound<'py, PyBytes>, u64)> {
        let limits = Limits { fuel, memory, timeout, output };
        let (reply, out, err, used) = py.allow_threads(|| self.call_in(request, limits, &mut [0; 4])).map_err(into_py)?;
        Ok((PyBytes::new(py, &reply), PyBytes::new(py, &out), PyBytes::new(py, &err), used))
    }

    /// `call` with default limits, returning the nanoseconds of its phases instead: (WASI
    /// context and Store, instantiation, the run, dropping the Store); the first two are 0
    /// when a spare was ready, the last when the keeper thread drops it.
    fn phases(&self, py: Python<'_>, request: &[u8]) -> PyResult<[u64; 4]> {
        let limits = Limits { fuel: 50_000_000, memory: 64 << 20, timeout: 2.0, output: 64 << 10 };
        let mut times = [0; 4];
        py.allow_threads(|| self.call_in(request, limits, &mut times)).map_err(into_py)?;
        Ok(times)
    }
}

impl PythonRuntime {
    fn call_in(&self, request: &[u8], limits: Limits, times: &mut [u64; 4]) -> Result<Reply, (&'static str, String)> {
        let ready = self.inner.spare.lock().unwrap().take().filter(|spare| spare.limits == limits);
        let instance = match ready {
            Some(spare) => spare,
            None => self.inner.prepare(limits, times)?,
        };
        let started = Instant::now();
        let (result, store) = self.inner.run(instance, request);
        times[2] = started.elapsed().as_nanos() as u64;
        let started = Instant::now();
        match &self.keeper {
            Some(keeper) => {
                if let Err(TrySendError::Full(job)) = keeper.try_send(Job::Drop(store)) {
                    drop(job);
                }
                let _ = keeper.try_send(Job::Prepare(limits));
            }
            None => drop(store),
        }
        times[3] = started.elapsed().as_nanos() as u64;
        result
    }
}

impl Inner {
    fn prepare(&self, limits: Limits, times: &mut [u64; 4]) -> Result<Instance, (&'static str, String)> {
        let started = Instant::now();
        let (stdout, stderr) = (MemoryOutputPipe::new(limits.output), MemoryOutputPipe::new(limits.output));
        let wasi = WasiCtxBuilder::new()
            .arg("python")
            .preopened_dir(&self.stdlib, "/python", FsPerms::ReadOnly)
            .map_err(|e| ("capability_denied", format!("the stdlib could not be opened: {e}")))?
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .build();
        let store_limits = StoreLimitsBuilder::new().memory_size(limits.memory).build();
        let state = PyState { wasi, table: ResourceTable::new(), limits: store_limits };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limits);
        // fuel and a deadline for instantiation (the component's start code); renewed by `run`
        store.set_fuel(limits.fuel).map_err(classify)?;
        store.set_epoch_deadline(self.ticks(limits.timeout));
        times[0] = started.elapsed().as_nanos() as u64;
        let started = Instant::now();
        let instance = self.pre.instantiate(&mut store).map_err(classify)?;
        let run = instance
            .get_func(&mut store, &self.run)
            .ok_or(("bad_module", "the component exports no `run`".to_string()))?;
        times[1] = started.elapsed().as_nanos() as u64;
        Ok(Instance { store, run, stdout, stderr, limits })
    }

    /// Full fuel and a deadline from now, then the call. The Store comes back to be dropped.
    fn run(&self, instance: Instance, request: &[u8]) -> (Result<Reply, (&'static str, String)>, Store<PyState>) {
        let Instance { mut store, run, stdout, stderr, limits } = instance;
        let result = (|| {
            store.set_fuel(limits.fuel).map_err(classify)?;
            store.set_epoch_deadline(self.ticks(limits.timeout));
            let run = run.typed::<(&[u8],), (Vec<u8>,)>(&store).map_err(classify)?;
            let (reply,) = run.call(&mut store, (request,)).map_err(classify)?;
            if reply.len() > limits.output {
                return Err(("output_limit", format!("result of {} bytes exceeds the output cap", reply.len())));
            }
            let used = limits.fuel - store.get_fuel().map_err(classify)?;
            Ok((reply, stdout.contents().to_vec(), stderr.contents().to_vec(), used))
        })();
        (result, store)
    }

    fn ticks(&self, timeout_s: f64) -> u64 {
        ((timeout_s / self.tick_s).ceil() as u64).max(1) + 1
    }
}

fn load_component(
    engine: &wasmtime::Engine,
    source: &Path,
    compiled: Option<&Path>,
) -> wasmtime::Result<component::Component> {
    if let Some(path) = compiled {
        if path.is_file() {
            // SAFETY: the file is one this module wrote with `serialize` (Wasmtime checks that
            // it was made by a compatible engine and refuses it otherwise).
            if let Ok(loaded) = unsafe { component::Component::deserialize_file(engine, path) } {
                return Ok(loaded);
            }
        }
    }
    let made = component::Component::from_file(engine, source)?;
    if let Some(path) = compiled {
        let partial = path.with_extension("partial");
        fs::write(&partial, made.serialize()?)?;
        fs::rename(&partial, path)?;
    }
    Ok(made)
}

/// MessagePack {"error": "not granted"}: what `call-host` answers.
fn refusal() -> Vec<u8> {
    let message = b"not granted";
    let mut out = vec![0x81, 0xa5];
    out.extend_from_slice(b"error");
    out.push(0xa0 | message.len() as u8);
    out.extend_from_slice(message);
    out
}

fn bad(message: &str) -> (&'static str, String) {
    ("bad_response", message.to_string())
}

/// The wasmbox error kind of a Wasmtime error, as `wasmbox._call.classify` names them.
fn classify(error: wasmtime::Error) -> (&'static str, String) {
    let kind = match error.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => "out_of_fuel",
        Some(Trap::Interrupt) => "timeout",
        _ if format!("{error:#}").contains("exceeds memory limits") => "memory_limit",
        _ => "trap",
    };
    (kind, format!("{error:#}"))
}

fn into_py((kind, message): (&'static str, String)) -> PyErr {
    CallFailed::new_err((kind, message))
}

fn failed(error: wasmtime::Error) -> PyErr {
    CallFailed::new_err(("host_error", format!("{error:#}")))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Engine>()?;
    m.add_class::<CoreTool>()?;
    m.add_class::<PythonRuntime>()?;
    m.add("CallFailed", m.py().get_type::<CallFailed>())?;
    m.add("WASMTIME_VERSION", "48.0.0")?;
    Ok(())
}
