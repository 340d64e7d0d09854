"""Our part inside vLLM's workers for `engine prepare --vllm-engine`: vLLM mixes this class into
every worker (`ParallelConfig.worker_extension_cls`), and the driver (engine/capture/vllm_engine.py)
calls its methods on all of them with `collective_rpc`. Nothing of vLLM is patched.

- `eagle3_capture_start(layer_ids)`: a model that implements vLLM's `SupportsEagle3`
  (Llama, Qwen, DeepSeek-V2/V3, Kimi-K2.5's multimodal wrapper, ...) is asked for the aux states
  with its own `set_aux_hidden_state_layers`; its forward then returns (hidden, [aux ...]), each
  aux `hidden_states + residual` at the INPUT of that layer id (id N: the last layer's output
  before the final norm), and a forward hook on the model hands vLLM the hidden part alone and
  keeps the rest. Any other model gets hooks on its decoder layers that take the same sums.
- Each forward is one engine step: its tokens, their positions and the states [T, L, H] are kept
  (on CPU) by TP rank 0 only; the other ranks hold identical copies and keep nothing.
- The steps reach the driver one of two ways. Where the driver maps the start's probe, a
  memory file of rank 0's (memfd, read through /proc/PID/fd/FD), `eagle3_capture_handover(path)`
  connects rank 0 to the driver's socket: each step is written into one of its memory files
  inside the forward and a line naming the file goes to the driver at once
  (engine/capture/step_channel.py), so the states are copied once, never cross vLLM's sockets
  (which carried 16 MB a call at about 200 MB/s here, serial with the forward; a Kimi-K2.5 call
  of 16k tokens is 0.9 GB), and the driver asks vLLM nothing between steps. The files come back
  to be written again (engine/capture/memory_files.py). Elsewhere (no memfd, /proc closed to
  the driver: `eagle3_capture_handover(None)`) `eagle3_capture_take()` returns the steps kept
  since the last take as bytes with their dtype and shape (`Packed`). Bytes, not tensors:
  vLLM's engine-core socket encodes a tensor in a result as a reference to a side buffer its
  decoder drops unless VLLM_ALLOW_INSECURE_SERIALIZATION (pickle) is on, while bytes travel as
  msgpack's own type, and the TP workers' queue pickles a bytearray out of band as it does a
  tensor.
- It also says which cores the worker's forward is bound to, so the driver keeps its own
  threads off them (engine/capture/forward_cores.py).
- `eagle3_capture_files()`: rank 0's memory files made, free and handed out (the capture's
  summary reports them).
- `eagle3_capture_stop()`: hooks removed, the model's aux layers reset.

The vLLM runner's `input_ids` buffer gives the step's tokens when a multimodal model is fed
embeddings instead of ids. Imports of vLLM stay inside the methods: this module is imported by
the engine's import checks, where vLLM is not installed.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
from torch import Tensor

from engine.capture.memory_files import FilePool, map_worker_file, memory_file
from engine.capture.step_channel import WorkerEnd, stack_states, write_step

#: a step as it crosses collective_rpc where the driver cannot map rank 0's memory files:
#: name -> (dtype name, shape, its bytes)
Packed = dict[str, tuple[str, list[int], bytes | bytearray]]
_PROBE = b"eagle3-capture"


def host_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[bytearray, Tensor]:
    """A CPU tensor to fill in place and the bytearray under it, which crosses collective_rpc
    as it is (msgpack's bin, pickle's bytearray): the states are copied once."""
    nbytes = math.prod(shape) * dtype.itemsize
    buf = bytearray(nbytes)
    flat = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
    return buf, flat.view(dtype).view(shape)


def pack(t: Tensor, raw: bytes | bytearray | None = None
         ) -> tuple[str, list[int], bytes | bytearray]:
    """One tensor for `Packed`: its bytes (`raw` where they are already a bytearray's)."""
    if raw is None:
        raw = t.contiguous().view(torch.uint8).numpy().tobytes()
    return str(t.dtype).removeprefix("torch."), list(t.shape), raw


def can_map(ref: Any) -> bool:
    """Whether this process maps the start's probe file and reads what the worker wrote."""
    if not isinstance(ref, (list, tuple)):
        return False
    try:
        with map_worker_file(ref) as mm:
            return mm[:len(_PROBE)] == _PROBE
    except (OSError, ValueError):
        return False


def unpack_step(packed: Packed) -> dict[str, Tensor]:
    """The tensors of a `Packed` step, viewing the received bytes (never written to)."""
    import warnings
    out = {}
    for k, (dtype, shape, raw) in packed.items():
        with warnings.catch_warnings():  # read-only bytes; nothing writes to them
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else \
                torch.empty(0, dtype=torch.uint8)
        out[k] = flat.view(getattr(torch, dtype)).reshape(shape)
    return out


class CaptureExtension:
    """The methods every vLLM worker gains (their names are prefixed: they share the worker's
    namespace)."""

    model_runner: Any  # the worker's, set by vLLM

    def eagle3_capture_start(self, layer_ids: list[int]) -> dict[str, Any]:
        from vllm.distributed import get_pp_group, get_tp_group
        from vllm.model_executor.models.interfaces import supports_eagle3

        if get_pp_group().world_size > 1:
            raise RuntimeError("pipeline parallelism is not supported for capture: use "
                               "--tp (tensor parallelism) only")
        self._e3_ids = sorted(set(int(i) for i in layer_ids))
        self._e3_rank0 = get_tp_group().rank_in_group == 0
        self._e3_steps: list[Packed] = []
        self._e3_handles: list[Any] = []
        self._e3_files: FilePool | None = None  # once the driver has mapped the probe
        self._e3_channel: WorkerEnd | None = None  # ... and rank 0 has connected to it
        self._e3_probe: list[int] = []  # the probe's file, closed at the handover
        probe = None
        if self._e3_rank0 and hasattr(os, "memfd_create"):
            fd, mm = memory_file(len(_PROBE))
            mm[:] = _PROBE
            mm.close()
            self._e3_probe.append(fd)
            probe = [os.getpid(), fd, len(_PROBE)]
        model = self.model_runner.get_model()
        if supports_eagle3(model):
            model.set_aux_hidden_state_layers(tuple(self._e3_ids))
            self._e3_handles.append(model.register_forward_hook(self._e3_on_model,
                                                                with_kwargs=True))
            how = "SupportsEagle3"
        else:
            self._e3_hook_layers(model)
            how = "decoder-layer hooks"
        return {"model": type(model).__name__, "how": how, "rank0": self._e3_rank0,
                "cpus": sorted(os.sched_getaffinity(0)),  # the forward's binding, if any
                "memfd_probe": probe}

    def eagle3_capture_handover(self, channel: str | None) -> bool:
        """The driver mapped the probe and listens at `channel` (rank 0 connects: its steps go
        there in memory files from now on), or could not (None: bytes, taken). Whether this
        worker connected."""
        self._e3_close(self._e3_probe)
        if not self._e3_rank0 or channel is None:
            return False
        try:
            self._e3_channel = WorkerEnd(channel)
        except OSError:  # not the driver's host after all: bytes, taken
            return False
        self._e3_files = FilePool()
        return True

    # -- collecting -------------------------------------------------------------------------------
    def _e3_step_ids(self, kwargs: dict[str, Any], args: tuple[Any, ...], n: int) -> Tensor:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:  # fed embeddings (a multimodal wrapper): the runner keeps the ids
            buf = getattr(self.model_runner, "input_ids", None)
            ids = getattr(buf, "gpu", buf)
            if ids is None:
                raise RuntimeError("capture: the step's token ids are not available")
        return ids[:n]

    def _e3_keep(self, ids: Tensor, positions: Tensor, states: list[Tensor]) -> None:
        if not self._e3_rank0:
            return
        if len(states) != len(self._e3_ids):
            raise RuntimeError(f"capture: the model returned {len(states)} hidden states for "
                               f"layer ids {self._e3_ids}")
        n = positions.shape[0]
        if self._e3_channel is not None and self._e3_files is not None:
            self._e3_files.give_back(self._e3_channel.given_back())
            self._e3_channel.send(write_step(self._e3_files, ids, positions, states))
            return
        raw, host = host_tensor((n, len(states), states[0].shape[-1]), states[0].dtype)
        stack_states(states, n, host)  # [T, L, H]
        # copies: on a CPU `.to` of an int64 CPU tensor is the runner's own buffer, rewritten
        # by the next step
        self._e3_steps.append({"input_ids": pack(ids[:n].to("cpu", torch.int64, copy=True)),
                               "positions": pack(positions.to("cpu", torch.int64, copy=True)),
                               "hidden_states": pack(host, raw)})

    def _e3_on_model(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     out: Any) -> Any:
        if not isinstance(out, tuple) or len(out) != 2 or not isinstance(out[1], list):
            return out  # a forward without aux states (vLLM's own dummy runs before start)
        hidden, aux = out
        positions: Tensor = kwargs["positions"] if "positions" in kwargs else args[1]
        self._e3_keep(self._e3_step_ids(kwargs, args, positions.shape[0]), positions, aux)
        return hidden

    def _e3_hook_layers(self, model: Any) -> None:
        """Hooks on the decoder layers of a model without SupportsEagle3: the input of each
        requested layer (hidden + residual), and the last layer's output for id N."""
        layers = _decoder_layers(model)
        n_layers = len(layers)
        bad = [i for i in self._e3_ids if not 0 <= i <= n_layers]
        if bad:
            raise RuntimeError(f"capture: layer ids {bad} outside 0..{n_layers}")
        pending: dict[int, Tensor] = {}
        step: dict[str, Any] = {}

        def value(hs: Tensor, res: Tensor | None) -> Tensor:
            return hs + res if res is not None else hs

        def before(i: int) -> Any:
            def hook(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                positions = kwargs.get("positions", args[0] if args else None)
                hs: Tensor = kwargs["hidden_states"] if "hidden_states" in kwargs else args[1]
                res = kwargs.get("residual", args[2] if len(args) > 2 else None)
                if i == 0:
                    step["positions"] = positions
                pending[i] = value(hs, res)
            return hook

        def after_last(mod: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            if n_layers in self._e3_ids:
                pending[n_layers] = value(*out) if isinstance(out, tuple) else out
            positions = step.pop("positions")
            states = [pending.pop(i) for i in self._e3_ids]
            self._e3_keep(self._e3_step_ids({}, (), positions.shape[0]), positions, states)

        for i in sorted(set(self._e3_ids) | {0}):
            if i < n_layers:
                self._e3_handles.append(layers[i].register_forward_pre_hook(before(i),
                                                                           with_kwargs=True))
        self._e3_handles.append(layers[-1].register_forward_hook(after_last, with_kwargs=True))

    # -- handing over -----------------------------------------------------------------------------
    def eagle3_capture_take(self) -> list[Packed] | None:
        """Rank 0 without the driver's channel: the steps since the last take (`Packed`), else
        None."""
        if not self._e3_rank0:
            return None
        steps, self._e3_steps = self._e3_steps, []
        return steps

    def eagle3_capture_files(self) -> dict[str, int] | None:
        """Rank 0: its memory files made, free and handed out (None: none, or another rank)."""
        f = self._e3_files if self._e3_rank0 else None
        return None if f is None else {"made": f.created, "free": len(f.free),
                                        "out": len(f.out)}

    @staticmethod
    def _e3_close(fds: list[int]) -> None:
        while fds:
            os.close(fds.pop())

    def eagle3_capture_stop(self) -> None:
        for h in self._e3_handles:
            h.remove()
        self._e3_handles = []
        self._e3_steps = []
        self._e3_close(self._e3_probe)
        if self._e3_channel is not None:
            self._e3_channel.close()
            self._e3_channel = None
        if self._e3_files is not None:
            self._e3_files.close()
            self._e3_files = None
        model = self.model_runner.get_model()
        from vllm.model_executor.models.interfaces import supports_eagle3
        if supports_eagle3(model):
            model.set_aux_hidden_state_layers(())


def _decoder_layers(model: Any) -> Any:
    """The decoder layer list of a vLLM model (text model inside a multimodal wrapper too)."""
    for path in ("model.layers", "language_model.model.layers", "model.language_model.layers",
                 "language_model.layers"):
        obj = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if obj is not None:
            return obj
    raise RuntimeError(f"capture: no decoder layers found in {type(model).__name__}")
