// The guest side of wasmbox's JavaScript runtime, evaluated once when the runtime is built.
// Its completion value is `install(host)`: the build calls it with the host-call function (a C
// function in a table slot the host fills in each instance) and keeps what it returns, `run`,
// `finish`, `check`, `reset` and `fail`, for every call. A call evaluates its code (a tool's source, then its
// entry is called with the args); `finish` makes the JSON reply, `{"ok": value}` or
// `{"error": text}`, of a script that has nothing left to await, and `run` that of one that
// has (top-level await, a promise, pending jobs); `fail` that of a script that did not compile.
// The references are taken here, once, so a script that replaces JSON or Object cannot change
// how its result is encoded.
(function install(host) {
  "use strict";
  const { stringify, parse } = JSON;
  const { defineProperty, freeze, fromEntries } = Object;
  const { isArray } = Array;
  const { isView } = ArrayBuffer;
  const { isSafeInteger } = Number;
  const { trunc } = Math;
  const arrayFrom = Array.from;
  const ErrorType = Error;
  const MapType = Map;
  const SetType = Set;
  const DataViewType = DataView;
  const StringOf = String;
  const ProxyType = Proxy;
  const globalEval = eval; // called by another name: an indirect eval, in the global scope
  const { setTimeout: osSetTimeout, clearTimeout: osClearTimeout } = os;
  let uncaught = null; // the first exception a timer's callback threw: the call fails with it

  // setTimeout(fn, ms, ...args) on QuickJS's timers, which run while the call awaits (the
  // host's event loop, `runner._settle`). An exception thrown in `fn` ends the call, as an
  // uncaught exception ends a Node process. Timers still pending when the value is ready do
  // not run. The delay is ToNumber(ms) (a BigInt or a Symbol throws a TypeError, as in browsers
  // and Node), in whole ms; NaN, zero and negative ones run at the next turn. A delay is what it
  // says, however long (neither wrapped at 2^31 as browsers do nor cut to 1 ms as Node does):
  // QuickJS's loop works out the next timer's delay in 32 bits, so a long one is armed in
  // steps of at most MAX_STEP ms under one id, and the host sees it due when it is.
  const MAX_STEP = 2 ** 30;
  const timers = new Map(); // a timer's id -> the QuickJS timer now standing for it
  const setTimeout = (fn, ms = 0, ...args) => {
    let left = +ms;
    left = left > 0 ? trunc(left) : 0;
    let id;
    const fire = () => {
      timers.delete(id);
      try {
        fn(...args);
      } catch (error) {
        uncaught ??= { error };
      }
    };
    const step = () => {
      const now = left > MAX_STEP ? MAX_STEP : left;
      left -= now; // (Infinity stays Infinity: never due)
      const timer = osSetTimeout(left > 0 ? step : fire, now);
      id ??= timer;
      timers.set(id, timer);
    };
    step();
    return id;
  };
  globalThis.setTimeout = setTimeout;
  // setInterval on the same timers: its id is its first timer's, so ids never clash, and
  // clearTimeout and clearInterval take either kind, as in browsers and Node.
  const intervals = new Map(); // setInterval's id -> its next timer
  globalThis.setInterval = (fn, ms = 0, ...args) => {
    let id;
    const tick = () => {
      const timer = setTimeout(() => {
        tick(); // the next one first, so that `fn` can clear it
        fn(...args);
      }, ms);
      id ??= timer;
      intervals.set(id, timer);
    };
    tick();
    return id;
  };
  const clear = (id) => {
    const timer = intervals.get(id) ?? id;
    intervals.delete(id);
    osClearTimeout(timers.get(timer) ?? timer); // (an id of os.setTimeout's own, too)
    timers.delete(timer);
  };
  globalThis.clearTimeout = clear;
  globalThis.clearInterval = clear;


  class HostCallError extends Error {
    constructor(message) {
      super(message);
      this.name = "HostCallError";
    }
  }

  // wasmbox.callHost(name, {keyword: value}): a host function the manifest grants; its value,
  // or a HostCallError saying why the host refused or the function failed.
  function callHost(name, args = {}) {
    if (typeof name !== "string") throw new TypeError("wasmbox.callHost: the name must be a string");
    if (args === null || typeof args !== "object" || isArray(args)) {
      throw new TypeError("wasmbox.callHost: args must be an object of keyword arguments");
    }
    const reply = parse(host(name, stringify(args, replacer)));
    if (reply !== null && typeof reply === "object" && "ok" in reply) return reply.ok;
    throw new HostCallError(reply && typeof reply.error === "string" ? reply.error : "malformed reply");
  }

  class ToolCallError extends HostCallError {
    constructor(tool, kind, message) {
      super(`${tool}: ${kind}: ${message}`);
      this.name = "ToolCallError";
      this.tool = tool;
      this.kind = kind;
      this.detail = message;
    }
  }

  // wasmbox.callTool(name, {arg: value}): a loaded tool the manifest's `tools` lists, run in its
  // own sandbox; its value, or a ToolCallError with the error's kind (a HostCallError when the
  // host refuses the call). `tools.name(args)` and `tools["name"](args)` are the same.
  function callTool(name, args = {}) {
    const reply = callHost("wasmbox.call_tool", { name, args });
    if (reply !== null && typeof reply === "object" && "ok" in reply) return reply.ok;
    const error = reply && typeof reply.error === "object" && reply.error !== null ? reply.error : {};
    throw new ToolCallError(StringOf(name), StringOf(error.kind), StringOf(error.message));
  }

  defineProperty(globalThis, "wasmbox", {
    value: freeze({ callHost, callTool, HostCallError, ToolCallError }),
    enumerable: false,
    writable: false,
    configurable: false,
  });
  defineProperty(globalThis, "tools", {
    value: new ProxyType(freeze({}), {
      get: (_, name) => (typeof name === "string" ? (args = {}) => callTool(name, args) : undefined),
    }),
    enumerable: false,
    writable: true,
    configurable: true,
  });

  // What JSON.stringify cannot write by itself: BigInt (a number when exact, else its
  // digits), Map (an object), Set and typed arrays (arrays).
  function replacer(key, value) {
    if (typeof value === "bigint") {
      const number = Number(value);
      return isSafeInteger(number) ? number : StringOf(value);
    }
    if (value instanceof MapType) return fromEntries(value);
    if (value instanceof SetType) return arrayFrom(value);
    if (isView(value) && !(value instanceof DataViewType)) return arrayFrom(value);
    return value;
  }

  function encode(value) {
    const text = stringify(value, replacer);
    return text === undefined ? "null" : text; // undefined, a function, a symbol
  }

  function describe(error) {
    try {
      if (error instanceof ErrorType) {
        const head = `${error.name}: ${error.message}`;
        const stack = typeof error.stack === "string" ? error.stack.replace(/\s+$/, "") : "";
        return stack ? `${head}\n${stack}` : head;
      }
      return `Uncaught ${typeof error === "string" ? stringify(error) : StringOf(error)}`;
    } catch {
      return "Uncaught exception (it could not be described)";
    }
  }

  // console.log and print write a line to stdout, console.error and console.warn to stderr,
  // flushed at once (a call that is stopped keeps what it printed): strings as they are,
  // errors with their stack, other objects as JSON where they can be.
  function show(value) {
    if (typeof value === "string") return value;
    if (value instanceof ErrorType) return describe(value);
    if (typeof value === "function") return `[Function: ${value.name || "anonymous"}]`;
    if ((typeof value === "object" && value !== null) || typeof value === "bigint") {
      try {
        const text = stringify(value, replacer);
        if (text !== undefined) return text;
      } catch {
        // a cycle, or a getter that throws: its plain form below
      }
    }
    try {
      return StringOf(value);
    } catch {
      return "[unprintable]";
    }
  }

  function writer(file) {
    return (...values) => {
      file.puts(values.map(show).join(" ") + "\n");
      file.flush();
    };
  }

  const log = writer(std.out);
  const warn = writer(std.err);
  globalThis.console = { log, info: log, debug: log, error: warn, warn };
  globalThis.print = log;

  function fail(error) {
    // (framed by hand: stringify of an object would consult Object.prototype.toJSON, which
    // the script may have replaced; of a string it consults nothing)
    return `{"error":${stringify(describe(error))}}`;
  }

  // The tool's entry, by its name in the global scope: a function, var, let or const binding
  // (the host checked it is an identifier), called with the args.
  function callEntry(entry, args) {
    let found;
    try {
      found = globalEval(entry);
    } catch {
      found = undefined;
    }
    if (typeof found !== "function") {
      throw new TypeError(`the tool's entry ${entry} is not a function its source defines`);
    }
    return found(parse(args));
  }

  function isThenable(value) {
    return (typeof value === "object" || typeof value === "function") && value !== null &&
      typeof value.then === "function";
  }

  // A script evaluated without top-level await, whose jobs have all run: its completion value
  // (or the entry's result) as the reply, at once; a promise of it when there is one to await.
  function finish(value, entry, args) {
    try {
      if (entry !== undefined) value = callEntry(entry, args);
      if (isThenable(value)) return run(value, false);
      if (uncaught !== null) throw uncaught.error;
      return `{"ok":${encode(value)}}`;
    } catch (error) {
      return fail(error);
    }
  }

  // The reply once everything is awaited: `evaluated` is the async script's promise of
  // {value} (`async`), or a value to await.
  async function run(evaluated, async, entry, args) {
    try {
      let value = async ? (await evaluated).value : evaluated;
      if (entry !== undefined) value = callEntry(entry, args);
      value = await value;
      if (uncaught !== null) throw uncaught.error;
      return `{"ok":${encode(value)}}`;
    } catch (error) {
      return fail(error);
    }
  }

  // The reply of a call a timer's callback failed, once the host is about to wait: else undefined.
  function check() {
    return uncaught === null ? undefined : fail(uncaught.error);
  }

  // A session's next run starts clean: the timers an earlier run left pending never fire in
  // it (as a fresh call's never run at all), and a timer's old exception does not fail it.
  function reset() {
    for (const timer of timers.values()) osClearTimeout(timer);
    timers.clear();
    intervals.clear();
    uncaught = null;
  }

  return freeze({ run, finish, check, reset, fail });
})
