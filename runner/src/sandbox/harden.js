// Runs once in the realm a worker saves as its image (every run starts from
// that image), before any script, with natives from the runner. It removes ambient authority and nondeterminism, pins the globals
// that replay depends on, and returns helpers the runner uses per run.
(function harden(natives) {
  'use strict';
  const g = globalThis;
  const { defineProperty, freeze, setPrototypeOf } = Object;
  const construct = Reflect.construct;
  const apply = Reflect.apply;
  const bind = Function.prototype.bind;
  const reflectGet = Reflect.get;
  const ObjectPrototype = Object.prototype;
  const pin = (target, name, value) =>
    defineProperty(target, name, { value, writable: false, enumerable: false, configurable: false });

  // Ambient authority: of the names a script must not find, only these two
  // are part of the intrinsics the runner adds (no timers, WeakRef,
  // performance, typed arrays or I/O are ever installed).
  delete g.eval;
  delete g.queueMicrotask;

  // Error hooks would let a script run code while the engine builds an error,
  // including errors the runner creates; pin them to their defaults.
  pin(Error, 'prepareStackTrace', undefined);
  pin(Error, 'stackTraceLimit', 10);

  // Deterministic time.
  const OriginalDate = Date;
  const now = natives.now;
  const DeterministicDate = function Date(...args) {
    if (new.target === undefined) {
      return construct(OriginalDate, [now()]).toString();
    }
    return construct(OriginalDate, args.length === 0 ? [now()] : args, new.target);
  };
  pin(DeterministicDate, 'prototype', OriginalDate.prototype);
  pin(DeterministicDate, 'now', now);
  pin(DeterministicDate, 'parse', OriginalDate.parse);
  pin(DeterministicDate, 'UTC', OriginalDate.UTC);
  defineProperty(OriginalDate.prototype, 'constructor', {
    value: DeterministicDate, writable: false, enumerable: false, configurable: false,
  });
  freeze(DeterministicDate);
  pin(g, 'Date', DeterministicDate);

  // Deterministic randomness.
  pin(Math, 'random', natives.random);
  pin(g, 'Math', Math);

  // JSON and Promise are left alone: the runner uses the engine's own parser
  // and promise capabilities, never these globals, so a script that changes
  // them only changes what it sees (and replays the same way). Touching them
  // here would also build them in every realm, used or not.

  // Host functions and console methods are the runner's dispatching natives
  // bound to an index; the natives find the current run themselves.
  const bindNative = (native, argument, name) => {
    const bound = apply(bind, native, [undefined, argument]);
    defineProperty(bound, 'name', { value: name, writable: false, enumerable: false, configurable: true });
    return bound;
  };
  const { hostCall, consoleWrite, unknownFunction } = natives;

  // Looking up a missing function on a namespace yields a function that fails
  // with RUN_HOST_FUNCTION_ERROR naming what exists.
  const makeNamespace = (name, functions, indexes) => {
    const members = {};
    for (let i = 0; i < functions.length; i++) {
      const value = bindNative(hostCall, indexes[i], functions[i]);
      defineProperty(members, functions[i], { value, writable: true, enumerable: true, configurable: true });
    }
    const fallback = new Proxy(ObjectPrototype, {
      get(target, key, receiver) {
        if (typeof key !== 'string' || key === 'then' || key in target) {
          return reflectGet(target, key, receiver);
        }
        return function unknownHostFunction() { return unknownFunction(name + '.' + key); };
      },
    });
    setPrototypeOf(members, fallback);
    freeze(members);
    pin(g, name, members);
  };

  const console = { __proto__: null };
  const levels = [['log', 0], ['debug', 0], ['info', 1], ['warn', 2], ['error', 3]];
  for (let i = 0; i < levels.length; i++) {
    console[levels[i][0]] = bindNative(consoleWrite, levels[i][1], levels[i][0]);
  }
  pin(g, 'console', freeze(console));

  const stackAccessor = Object.getOwnPropertyDescriptor(Error.prototype, 'stack');
  return freeze({
    __proto__: null,
    makeNamespace,
    dateToISOString: OriginalDate.prototype.toISOString,
    errorStack: stackAccessor && typeof stackAccessor.get === 'function' ? stackAccessor.get : undefined,
  });
})
