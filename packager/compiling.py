"""A build's compile stage: every requested (target, precision) of the model compiled into
``Code``, with the weights archive its artifact stores.

- Each precision's rewrite of the model (codegen/precisions/) runs once, here, for every target
  (``Models``), and its weights archive is written once, to a file (packager/weights.py): every
  artifact of the precision stores it, the graph's constants become views of it, and it goes
  into the container by a kernel copy.
- The slow targets (LLVM) compile in worker processes, side by side, when the model is big
  enough to repay a worker's start; a worker gets the graph without its weights and maps the
  archive's file, so no weight is pickled there, nor back.
- The kernel cache (packager/cache.py) reuses what an earlier build compiled, the weights
  archive included.
- After an artifact missed its tolerance, ``direct_again`` compiles it without its inexact
  passes, ``quantize_less`` keeps more int8 activations in f32.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mlpack.codegen import cores
from mlpack.codegen import precisions as precision_modules
from mlpack.codegen.targets import registry
from mlpack.codegen.targets.base import Code
from mlpack.spec.container import FileBlob
from mlpack.packager import weights as weights_files


@dataclass
class Native:
    """One (target, precision) compiled: the code, its weights archive and how long it took."""

    code: Code
    weights: bytes | FileBlob
    seconds: float
    dropped: tuple[str, ...] = ()   # inexact passes left out after the first try missed
    f32_activations: int = 0        # int8 activations kept in f32 after the first try missed


class Models:
    """The model in each precision a build makes, and each one's weights archive, made once:
    ``graph(p)`` is the precision's rewrite (with its calibration), ``blob(p)`` its archive in a
    file, whose arrays then back the graph's constants. ``folder``: where the archives are
    written (the kernel cache's blobs, or a scratch folder ``close`` removes); ``cache``: the
    KernelCache that remembers which archive a graph has."""

    def __init__(self, graph, calibrations: dict, folder: Path, cache=None, scratch=False):
        self.base, self.calibrations = graph, calibrations
        self.folder, self.cache, self.scratch = folder, cache, scratch
        self._graphs: dict[str, tuple] = {}   # precision -> (calibration, graph)
        self._blobs: dict[str, FileBlob | None] = {}
        self._archives: dict[bytes, bytes] = {}   # an artifact's own archive, once per content

    def graph(self, precision: str):
        calibration = self.calibrations.get(precision)
        made = self._graphs.get(precision)
        if made is None or made[0] is not calibration:   # (int8 again, with fewer activations)
            g = self.base if precision == "fp32" else \
                precision_modules.apply(precision, self.base, calibration)
            self._blobs.pop(precision, None)
            self._graphs[precision] = (calibration, g)
            if self.blob(precision) is not None:
                self._graphs[precision] = (calibration, weights_files.attach(g, self._blobs[precision]))
        return self._graphs[precision][1]

    def rebase(self) -> None:
        """Take the fp32 graph, its constants mapped from its archive, as the base: the
        compiled graph's own arrays (a copy of every weight, from the import) are then freed."""
        from mlpack.packager.cache import carry_digest

        if self.blob("fp32") is not None:
            mapped = self.graph("fp32")
            carry_digest(self.base, mapped)
            self.base = mapped

    def blob(self, precision: str) -> FileBlob | None:
        """The precision's weights archive (None where some constant's dtype has no archive
        spelling: then each artifact stores its own)."""
        if precision in self._graphs:   # made anew if its calibration changed (int8 again
            # with fewer activations, its code from the kernel cache: nothing compiled asked
            # for the new graph, whose f32 contractions need their f32 weights)
            self.graph(precision)
        if precision not in self._blobs:
            self._blobs[precision] = None   # (graph() asks while making it)
            g = self._graphs[precision][1] if precision in self._graphs else self.graph(precision)
            key = self._key(precision)
            blob = self.cache.get_weights(key, self.folder) if key else None
            if blob is None:
                tensors = weights_files.storable(g)
                if tensors or not g.constants:
                    blob = weights_files.write(tensors, self.folder)
                    if key:
                        self.cache.put_weights(key, blob)
            self._blobs[precision] = blob
        return self._blobs[precision]

    def _key(self, precision: str) -> str | None:
        if self.cache is None:
            return None
        from mlpack.packager.cache import graph_key

        return graph_key(self.base, "weights", precision, frozenset(),
                         self.calibrations.get(precision))

    def archive(self, code: Code, precision: str) -> bytes | FileBlob:
        """The weights archive of an artifact of ``precision`` compiled into ``code``: the
        precision's own, or (a target that made weights of its own) one for it alone."""
        from mlpack.spec.tensorfile import write_tensors

        blob = self.blob(precision)
        if code.raw_weights and not code.weights and blob is not None:
            return blob
        data = write_tensors(code.tensors(self.graph(precision)))
        return self._archives.setdefault(data, data)

    def close(self) -> None:
        """Remove the scratch folder (the archives are in the containers written by now)."""
        if self.scratch:
            import shutil

            shutil.rmtree(self.folder, ignore_errors=True)


def skip_reason(error: Exception) -> str:
    return str(error).removeprefix("cpu: ")


def compile_one(graph, target: str, precision: str = "fp32", disabled=frozenset()):
    """One target's code (in a worker process for the slow ones) from ``graph``, the model in
    ``precision`` (or a weights_files.Detached of it): (Code, seconds), or the
    UnsupportedTargetError saying what it cannot lower. ``disabled``: the target's passes to
    leave out."""
    from mlpack.codegen.errors import UnsupportedTargetError

    from mlpack.codegen.progress import reporting
    from mlpack.packager.progress import done

    t0 = time.perf_counter()
    if isinstance(graph, weights_files.Detached):
        graph = graph.attach()
    try:
        with reporting((target, precision)):   # what the progress display says is compiling
            code = registry.get(target).compile(graph, precision, frozenset(disabled))
    except UnsupportedTargetError as e:
        return e, 0.0
    finally:
        done((target, precision))
    return code, time.perf_counter() - t0


# Models with at least this many ops, or this many contractions, compile their cpu targets in
# parallel worker processes (LLVM's optimizer is most of a build: resnet50 spends ~10 s per
# target in it, vgg19's 19 contractions 4 s). Smaller ones compile in this process, where a
# worker's start (importing llvmlite and mlpack) would cost more than it saves.
PARALLEL_MIN_OPS = 64
PARALLEL_MIN_CONTRACTIONS = 8


def _worth_workers(graph) -> bool:
    ops = [op for op in graph.ops if getattr(op, "rdims", None) and op.reduce == "sum"]
    return len(graph.ops) >= PARALLEL_MIN_OPS or len(ops) >= PARALLEL_MIN_CONTRACTIONS


@contextmanager
def _spawning_without_main():
    """Workers spawned inside this block do not import the caller's ``__main__``.

    A spawned process runs the parent's main script again (as ``__mp_main__``) before it
    unpickles its task, so that functions defined there can be found. A compile worker runs
    only mlpack's code, and a script calling ``mlpack.build`` at its top level, without an
    ``if __name__ == "__main__"`` guard, would otherwise run itself once per worker, and each
    of those runs would die starting workers of its own (multiprocessing's "bootstrapping
    phase" error) and take the build with it. ``spawn.get_preparation_data`` is multiprocessing's
    one place that names the main module to the child; while the workers start, it leaves it
    out. (Swapped in multiprocessing's module while this thread starts the pool's processes.)
    """
    from multiprocessing import spawn

    real = spawn.get_preparation_data

    def without_main(name):
        data = real(name)
        data.pop("init_main_from_name", None)
        data.pop("init_main_from_path", None)
        return data

    spawn.get_preparation_data = without_main
    try:
        yield
    finally:
        spawn.get_preparation_data = real


class _Workers:
    """The slow pairs compiling in spawned worker processes, one per core, from now on."""

    def __init__(self, one, models: Models, slow: list):
        import multiprocessing
        import signal
        import threading
        from concurrent.futures import ProcessPoolExecutor

        # spawn, not fork: the build process has ONNX Runtime's threads running
        from mlpack.packager.progress import pool_options

        context = multiprocessing.get_context("spawn")
        # the compiles not yet finished: a worker's LLVM takes the cores the finished ones
        # left (codegen/cores.py)
        self.unfinished = context.Value("i", len(slow))
        shown = pool_options(context)
        self.pool = ProcessPoolExecutor(
            min(len(slow), cores.machine()), mp_context=context, initializer=_worker_init,
            initargs=(self.unfinished, shown.get("initializer"), shown.get("initargs", ())))
        self.processes = self.pool._processes  # private, but the only handle on the workers
        self.futures, failed = {}, []
        sent = {p: weights_files.detach(models.graph(p), models.blob(p))
                for p in dict.fromkeys(p for _, p in slow)}

        def start() -> None:
            # The workers start (on submit) in a thread of their own, so a Ctrl-C, raised in
            # the main thread, cannot cut one's start in half (it would die with a traceback),
            # and with SIGINT blocked, a mask they inherit through exec: a terminal sends them
            # Ctrl-C too, and this process answers it, not they.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                with _spawning_without_main():
                    self.futures.update((pair, self.pool.submit(one, sent[pair[1]], *pair))
                                        for pair in slow)
            except BaseException as e:  # after cancel, too: it starts no more workers
                failed.append(e)

        try:
            starter = threading.Thread(target=start, name="mlpack-compile-start")
            starter.start()
            starter.join()
            if failed:
                raise failed[0]
            for future in self.futures.values():
                future.add_done_callback(self._finished)
        except BaseException:
            self.cancel()
            raise

    def _finished(self, _future) -> None:
        with self.unfinished.get_lock():
            self.unfinished.value -= 1

    def results(self) -> dict:
        try:
            out = {pair: f.result() for pair, f in self.futures.items()}
        except BaseException:
            self.cancel()
            raise
        self.pool.shutdown()
        return out

    def cancel(self) -> None:
        """Stop now (Ctrl-C, a failed compile or step), not after the other targets' LLVM runs.
        The shutdown waits out a submit under way, so ``processes`` is complete after it."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in list(self.processes.values()):
            process.terminate()
        # The pool's manager thread notices the dead workers and closes its wake-up pipe; if
        # that were still under way at exit, CPython 3.11's exit hook would write to the pipe
        # as it closes ("Exception ignored ... Bad file descriptor", gh-125451). Bounded: a
        # Ctrl-C must not wait on it, and on a loaded machine the thread can take longer than
        # that (CI saw it once more), so the hook's writes are made to let a closed pipe be, as
        # Python 3.12 does: to every pool's pipe it writes to (its registry), not only this
        # pool's (a Ctrl-C in CI printed the message with this pool's alone made quiet).
        from concurrent.futures import process as futures_process
        for wakeup in list(getattr(futures_process, "_threads_wakeups", {}).values()):
            _quiet_wakeup(wakeup)
        manager = getattr(self.pool, "_executor_manager_thread", None)
        if manager is not None:
            manager.join(timeout=1.0)


def _worker_init(unfinished, init, args) -> None:
    """In a compile worker: its LLVM's share of the cores counted from ``unfinished``, and
    the progress display's initializer ``init(*args)``, if any (packager/progress.py)."""
    cores.set_unfinished(unfinished)
    if init is not None:
        init(*args)


def _quiet_wakeup(wakeup) -> None:
    """``wakeup.wakeup()`` (a ProcessPoolExecutor's ``_ThreadWakeup``) made to ignore the pipe
    being closed under it by the pool's manager thread."""
    if wakeup is None or not callable(getattr(wakeup, "wakeup", None)):
        return
    send = wakeup.wakeup

    def quiet() -> None:
        try:
            send()
        except (OSError, ValueError):   # (closed between its check and its write)
            pass
    wakeup.wakeup = quiet


class Started:
    """The compile of ``pairs`` (those that need nothing the build computes later: no
    calibration) started before the build's reference step: what the kernel cache has is read,
    the slow targets go to worker processes when the model repays them, and ``finish``
    compiles the rest here and collects. On two cores the references and the compile then
    share the machine instead of taking turns. ``cancel`` stops the workers (the build failed
    or was interrupted in between)."""

    def __init__(self, one, models: Models, pairs: list, progress=None, cache=None):
        import contextlib

        from mlpack.packager.cache import lookup
        from mlpack.packager.progress import tracking

        self.one, self.models, self.pairs, self.cache = one, models, list(pairs), cache
        self.found, misses, self.keys = lookup(cache, models, self.pairs)
        self.stack = contextlib.ExitStack()
        self.stack.enter_context(tracking(progress, misses))
        slow = [pair for pair in misses if registry.get(pair[0]).parallel]
        self.workers = None
        if min(len(slow), cores.machine()) >= 2 and _worth_workers(models.base):
            try:
                self.workers = _Workers(one, models, slow)
            except BaseException:
                self.stack.close()
                raise
        self.here = [pair for pair in misses if self.workers is None or pair not in slow]

    def busy(self) -> bool:
        """Whether compile workers are still at work (holding the cores)."""
        return self.workers is not None and not all(
            f.done() for f in self.workers.futures.values())

    def finish(self) -> dict:
        """{pair: (Code or UnsupportedTargetError, seconds)} of every pair."""
        from mlpack.packager.cache import store

        try:
            results = {pair: self.one(self.models.graph(pair[1]), *pair) for pair in self.here}
            if self.workers is not None:
                results.update(self.workers.results())
        except BaseException:
            self.cancel()
            raise
        self.stack.close()
        store(self.cache, self.keys, results)
        out = {**self.found, **results}
        return {pair: out[pair] for pair in self.pairs}

    def cancel(self) -> None:
        if self.workers is not None:
            self.workers.cancel()
        self.stack.close()


def early_pairs(pairs) -> list:
    """The pairs a build can start compiling before its reference step (``Started``): those of
    precisions that need no calibration."""
    return [pair for pair in pairs if not precision_modules.calibrates(pair[1])]


def compile_targets(one, models: Models, pairs, explicit, step, progress, cache=None,
                    error=RuntimeError, started: Started | None = None) -> tuple[dict, list]:
    """Compile every requested (target, precision): ({pair: Native}, [(target, why skipped)]).
    ``started``: the compile of some of them begun earlier, collected here.

    A target that cannot lower the model is skipped, or an ``error`` (build.BuildError) if it is
    in ``explicit`` (the portable one lowers every model). ``cache``: the KernelCache
    (packager/cache.py) that the code of earlier builds is reused from and this one's is stored
    in; None compiles all."""
    from mlpack.codegen.errors import UnsupportedTargetError

    compiled, skipped = {}, []
    slow = [pair for pair in pairs if registry.get(pair[0]).parallel]
    label = ", ".join(dict.fromkeys(t for t, _ in slow))
    with step("lower", f"{label} {'/'.join(dict.fromkeys(p for _, p in slow))}" if slow else ""):
        results = started.finish() if started is not None else {}
        rest = [pair for pair in pairs if pair not in results]
        if rest:
            results.update(Started(one, models, rest, progress, cache).finish())
    hits = set(cache.stats.hits) if cache is not None else set()
    for pair in pairs:
        target = pair[0]
        code, seconds = results[pair]
        if isinstance(code, UnsupportedTargetError):
            if target in explicit or target == registry.ALWAYS:
                raise error(f"{target}: {skip_reason(code)} (asked for with --target "
                            f"{target}; leave it out to build the portable artifact)") from None
            skipped.append((target, skip_reason(code)))
            continue
        compiled[pair] = Native(code, models.archive(code, pair[1]), seconds)
        if progress and pair in hits and pair in slow:
            progress(f"  {target}: from the kernel cache ({seconds:.2f}s)")
        elif progress and pair in slow:
            t = code.timings
            progress(f"  {target}: {seconds:.1f}s (lower {t.get('lower', 0):.1f}s, "
                     f"llvm {t.get('llvm', 0):.1f}s, link {t.get('link', 0):.1f}s)")
    return compiled, skipped


def compile_again(one, cache, models: Models, again: list, compiled: dict,
                  disabled=frozenset(), f32_activations: int = 0) -> None:
    """Compile the pairs ``again`` once more (through the kernel cache) into ``compiled``,
    their seconds added to the first try's: a retry after an artifact missed its tolerance."""
    from mlpack.packager.cache import compile_cached

    def here(models_, pairs):
        return {p: one(models_.graph(p[1]), *p, disabled=disabled) for p in pairs}
    results = compile_cached(cache, models, again, here, disabled=disabled)
    for p in again:
        code, seconds = results[p]
        compiled[p] = Native(code, models.archive(code, p[1]), compiled[p].seconds + seconds,
                             tuple(disabled), f32_activations)


def direct_again(one, error, pairs, compiled: dict, models: Models, progress, cache=None) -> bool:
    """Compile the failing artifact again without its inexact passes, if it ran any (the cpu
    target's Winograd convolutions: their rounding, codegen/targets/cpu/winograd.py, is the one
    difference from the direct sums that the tolerance may not cover). Whether it did so.
    ``error``: the DeadOnArrivalError the build met."""
    pair = pairs[error.index] if error.index is not None else None
    native = compiled.get(pair)
    if native is None or not native.code.inexact_passes:
        return False
    passes = native.code.inexact_passes
    if progress:
        progress(f"  {pair[0]}: {', '.join(passes)} misses the {pair[1]} tolerance; compiling "
                 f"without it")
    compile_again(one, cache, models, [pair], compiled, disabled=passes)
    return True


def quantize_less(one, error, pairs, compiled: dict, models: Models, progress, cache,
                  sensitive: list, calibration_feed) -> bool:
    """After an int8 artifact ran and missed its tolerance: keep the activations whose
    quantization alone moves the outputs most (``int8.most_sensitive``, measured once into
    ``sensitive``) in f32, 1, 2, 4, ... of them up to half, and compile every int8 artifact
    again with the rest quantized; whether it did. The mixed precision ONNX Runtime's and
    TensorRT's users reach by excluding layers by hand, found by measurement."""
    from mlpack.codegen.precisions import int8

    pair = pairs[error.index] if error.index is not None else None
    calibrations = models.calibrations
    if pair is None or pair[1] != "int8" or not error.missed or not calibrations.get("int8"):
        return False
    if not sensitive:
        sensitive.append(dict(calibrations["int8"]))
        sensitive.extend(int8.most_sensitive(models.base, sensitive[0], calibration_feed()))
    full, order = sensitive[0], sensitive[1:]
    kept = max(1, 2 * compiled[pair].f32_activations)
    if kept > len(order) // 2:
        return False
    if progress:
        progress(f"  int8 misses its tolerance on {pair[0]}; compiling every int8 artifact again "
                 f"with the {kept} most sensitive of {len(order)} quantized activations in f32")
    calibrations["int8"] = {n: r for n, r in full.items() if n not in order[:kept]}
    compile_again(one, cache, models, [p for p in pairs if p[1] == "int8"], compiled,
                  f32_activations=kept)
    return True
