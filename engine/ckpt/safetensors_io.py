"""Weight files without surprises: validated safetensors headers, streaming reads and writes.

Plain tensor reads go through the safetensors library (`safe_open`). Hand-written here is only
what the library lacks: the header validation that names the file and tensor in one line and
gives each tensor's byte range (the library keeps offsets private), row reads (`load_rows`: only
the rows asked for), raw byte chunks and the kernel byte copy (`raw_chunks`,
`SafetensorsWriter.copy_from`: bytes copied, never decoded), and the streaming writer
(`SafetensorsWriter`: header first, then tensor by tensor; the library writes only whole dicts).

Readers
    open_weights(dir) -> WeightSet over `model.safetensors.index.json` (sharded),
    `model.safetensors` (or a single other *.safetensors), `pytorch_model.bin.index.json` or
    `pytorch_model.bin`.
    A safetensors header is checked in full before any tensor is used (JSON, known dtypes, shapes
    that match their byte ranges, ranges that tile the data section, file size that matches), so a
    truncated or corrupt file fails with one line naming the file and the tensor. `.bin` files
    load only with `torch.load(weights_only=True)` (memory-mapped): arbitrary pickles never run.
    Only regular files are opened (a FIFO or device is refused without blocking: open_regular),
    and an index's weight_map may only name files inside the checkpoint (safe_shard_path).
Writers
    SafetensorsWriter(path, [(name, dtype_code, shape)], metadata): writes the header first, then
    each tensor's bytes in order, so a converter streams tensor by tensor (or chunk by chunk).
Helpers
    torch_dtype(code) / st_code(dtype), tensor_bytes(t); open_regular, sha256_file and the JSON
    reader live in engine/fileio.py (re-exported here for old callers).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from engine.errors import EngineError
from engine.fileio import (  # noqa: F401 -- sha256_file, read_regular_text: re-exported
    file_kind,
    open_regular,
    read_json,
    read_regular_text,
    reason,
    sha256_file,
)

CHUNK = 8 << 20  # bytes per read/write while streaming
MAX_HEADER = 100 << 20  # the safetensors library's own limit

ST_DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2), "I64": (torch.int64, 8), "I32": (torch.int32, 4),
    "I16": (torch.int16, 2), "I8": (torch.int8, 1), "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1), "F8_E4M3": (torch.float8_e4m3fn, 1),
    "F8_E5M2": (torch.float8_e5m2, 1),
}
_CODES = {dt: code for code, (dt, _) in ST_DTYPES.items()}
FLOAT_CODES = ("F64", "F32", "F16", "BF16")


def torch_dtype(code: str) -> torch.dtype:
    return ST_DTYPES[code][0]


def st_code(dtype: torch.dtype) -> str:
    if dtype not in _CODES:
        raise EngineError(f"dtype {dtype} cannot be stored in safetensors")
    return _CODES[dtype]


def itemsize(code: str) -> int:
    return ST_DTYPES[code][1]


def _mode(path: Path) -> int:
    """stat(path).st_mode, or the one-line error naming the path (missing, symlink loop...)."""
    try:
        return os.stat(path).st_mode
    except OSError as e:
        raise EngineError(f"{path}: {reason(e)}") from None


def require_regular(path: Path) -> None:
    """For readers that take a path (torch.load): refuse anything but a regular file."""
    mode = _mode(path)
    if not stat.S_ISREG(mode):
        raise EngineError(f"{path}: not a regular file ({file_kind(mode)})")


def require_dir(d: Path) -> None:
    """A checkpoint directory: one line for a missing path, a symlink loop or a non-directory."""
    if not stat.S_ISDIR(_mode(d)):
        raise EngineError(f"{d}: not a directory")


@dataclass(frozen=True)
class Entry:
    """One stored tensor: where it lives and what it is, without its data."""

    name: str
    file: Path
    dtype: str  # safetensors code ("BF16", "I64", ...)
    shape: tuple[int, ...]
    offset: int = 0  # absolute byte offset in `file` (safetensors only)
    nbytes: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


def read_header(path: Path) -> tuple[dict[str, Entry], dict[str, str]]:
    """Parse and fully validate a safetensors header; returns entries (file order) and metadata."""
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise EngineError(f"{path}: truncated safetensors file ({size} bytes, no header)")
            n = int.from_bytes(head, "little")
            if n > MAX_HEADER or 8 + n > size:
                raise EngineError(f"{path}: truncated or corrupt safetensors header (header length "
                                  f"{n}, file size {size})")
            raw = f.read(n)
    except OSError as e:
        raise EngineError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise EngineError(f"{path}: corrupt safetensors header (not JSON: {e})") from e
    except RecursionError:  # the parser's own stack: a header nested thousands deep
        raise EngineError(f"{path}: corrupt safetensors header (JSON nested too "
                          "deeply)") from None
    if not isinstance(header, dict):
        raise EngineError(f"{path}: corrupt safetensors header (not a JSON object)")
    meta = header.pop("__metadata__", None)
    if meta is None:
        meta = {}
    elif not isinstance(meta, dict):
        raise EngineError(f"{path}: corrupt safetensors header ('__metadata__' is a JSON "
                          f"{_json_type(meta)}, not an object)")
    data_start = 8 + n
    entries: list[Entry] = []
    for name, info in header.items():
        where = f"{path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise EngineError(f"{where}: header entry is not an object")
        code, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if code not in ST_DTYPES:
            raise EngineError(f"{where}: unsupported dtype {code!r}")
        if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise EngineError(f"{where}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) for o in offs) or not 0 <= offs[0] <= offs[1]):
            raise EngineError(f"{where}: bad data_offsets {offs!r}")
        ent = Entry(name, path, code, tuple(shape), data_start + offs[0], offs[1] - offs[0])
        if ent.nbytes != ent.numel * itemsize(code):
            raise EngineError(f"{where}: {ent.nbytes} bytes stored for shape {list(shape)} "
                              f"{code}")
        entries.append(ent)
    entries.sort(key=lambda x: x.offset)
    pos = data_start
    for ent in entries:  # the byte ranges must tile the data section: no holes, no overlaps
        if ent.offset != pos:
            raise EngineError(f"{path}: tensor {ent.name!r}: corrupt header (data starts at "
                              f"{ent.offset - data_start}, expected {pos - data_start})")
        pos += ent.nbytes
    if pos != size:
        what = "truncated" if pos > size else "has trailing bytes"
        last = entries[-1].name if entries else "(none)"
        raise EngineError(f"{path}: {what}: header needs {pos} bytes, file has {size} "
                          f"(last tensor {last!r})")
    return {e.name: e for e in entries}, {str(k): str(v) for k, v in meta.items()}


def _json_type(v: Any) -> str:
    return {str: "string", list: "array", bool: "boolean", int: "number",
            float: "number"}.get(type(v), type(v).__name__)


class WeightSet:
    """All tensors of a checkpoint directory, by stored name, read lazily one at a time."""

    def __init__(self, kind: str, files: list[Path], entries: dict[str, Entry],
                 bin_state: dict[str, dict[str, torch.Tensor]] | None = None) -> None:
        self.kind = kind  # "safetensors" | "bin"
        self.files = files
        self.entries = entries
        self._bin = bin_state or {}

    def names(self) -> list[str]:
        return list(self.entries)

    def load(self, name: str) -> torch.Tensor:
        """The tensor as an independent CPU tensor (its own memory, not a view of the file)."""
        e = self.entries[name]
        if self.kind == "bin":
            return self._bin[str(e.file)][name].clone()
        from safetensors import SafetensorError, safe_open
        try:
            with safe_open(str(e.file), "pt") as f:  # the header was validated by read_header
                return f.get_tensor(name).clone()  # clone: safe_open maps the file
        except (SafetensorError, OSError) as err:  # changed on disk since it was opened
            raise EngineError(f"{e.file}: tensor {name!r}: cannot read ({err})") from None

    def load_rows(self, name: str, rows: torch.Tensor) -> torch.Tensor:
        """Selected rows of a 2-D tensor [len(rows), cols], reading only those rows' bytes."""
        e = self.entries[name]
        if len(e.shape) != 2:
            raise EngineError(f"{e.file}: tensor {name!r} is not 2-D")
        if self.kind == "bin":
            return self._bin[str(e.file)][name][rows].clone()
        row_bytes = e.shape[1] * itemsize(e.dtype)
        buf = bytearray(row_bytes * len(rows))
        view = memoryview(buf)
        with open_regular(e.file) as f:
            for i, r in enumerate(rows.tolist()):
                f.seek(e.offset + r * row_bytes)
                if f.readinto(view[i * row_bytes:(i + 1) * row_bytes]) != row_bytes:
                    raise EngineError(f"{e.file}: tensor {name!r}: file shrank while reading")
        if not buf:
            return torch.empty(0, e.shape[1], dtype=torch_dtype(e.dtype))
        return torch.frombuffer(buf, dtype=torch_dtype(e.dtype)).reshape(len(rows), e.shape[1])

    def raw_chunks(self, name: str, chunk: int = CHUNK) -> Iterator[memoryview]:
        """The stored bytes of a safetensors tensor, chunk by chunk through one reused buffer.
        Every chunk but the last is exactly `chunk` bytes (so, with `chunk` a multiple of 8,
        whole elements); a consumer must use a chunk before asking for the next."""
        e = self.entries[name]
        if self.kind == "bin":
            yield memoryview(tensor_bytes(self.load(name)))
            return
        buf = bytearray(min(chunk, max(e.nbytes, 1)))
        view = memoryview(buf)
        left = e.nbytes
        with open_regular(e.file, buffering=0) as f:
            f.seek(e.offset)
            while left:
                want, got = min(left, len(buf)), 0
                while got < want:  # fill the buffer: short reads must not split elements
                    n = f.readinto(view[got:want])
                    if not n:
                        raise EngineError(f"{e.file}: tensor {name!r}: file shrank while reading")
                    got += n
                left -= got
                yield view[:got]


def open_weights(d: Path) -> WeightSet:
    """Find and validate the weight files of a checkpoint directory."""
    require_dir(d)
    idx = d / "model.safetensors.index.json"
    if idx.exists():
        return _sharded(d, idx, "safetensors")
    single = d / "model.safetensors"
    others = sorted(p for p in d.glob("*.safetensors") if p.name != "model.safetensors")
    if single.exists() or len(others) == 1:
        path = single if single.exists() else others[0]
        entries, _ = read_header(path)
        return WeightSet("safetensors", [path], entries)
    if len(others) > 1:
        raise EngineError(f"{d}: several *.safetensors files and no model.safetensors.index.json")
    bidx = d / "pytorch_model.bin.index.json"
    if bidx.exists():
        return _sharded(d, bidx, "bin")
    if (d / "pytorch_model.bin").exists():
        return _bin_set([d / "pytorch_model.bin"])
    raise EngineError(f"{d}: no weights (model.safetensors, model.safetensors.index.json or "
                      "pytorch_model.bin)")


def shard_roots(d: Path) -> list[Path]:
    """Where the files of checkpoint `d` may really live: the directory itself, and for a
    Hugging Face hub cache snapshot (`.../snapshots/REV`) the repository's `blobs/`, which the
    snapshot's files are symlinks into."""
    root = Path(os.path.realpath(d))
    roots = [root]
    if root.parent.name == "snapshots":
        roots.append(root.parent.parent / "blobs")
    return roots


def safe_shard_path(d: Path, idx: Path, name: str, fname: Any) -> Path:
    """The shard a weight_map entry names, refused unless it is a relative name that stays
    inside the checkpoint once `..` and symlinks are resolved (an index is data from whoever
    published the checkpoint: it must not make us read, hash or copy files elsewhere)."""
    where = f"{idx}: weight_map entry {name!r}"
    if not isinstance(fname, str) or not fname or "\0" in fname:
        raise EngineError(f"{where}: {fname!r} is not a file name")
    if PurePosixPath(fname).is_absolute():
        raise EngineError(f"{where}: absolute path {fname!r} (shards must lie inside {d})")
    if os.path.normpath(fname).split(os.sep)[0] == "..":
        raise EngineError(f"{where}: {fname!r} leads outside the checkpoint {d}")
    p = d / fname
    real = Path(os.path.realpath(p))
    if not any(real == r or r in real.parents for r in shard_roots(d)):
        raise EngineError(f"{where}: {fname!r} leads outside the checkpoint {d} (a symlink to "
                          f"{real})")
    return p


def _sharded(d: Path, idx: Path, kind: str) -> WeightSet:
    index = read_json(idx, obj=False)
    wmap = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wmap, dict) or not wmap:
        raise EngineError(f"{idx}: field 'weight_map' missing or empty")
    paths = [safe_shard_path(d, idx, name, fname) for name, fname in wmap.items()]
    files: list[Path] = []
    for fname, p in zip(wmap.values(), paths, strict=True):
        if p not in files:
            try:
                mode = os.stat(p).st_mode
            except FileNotFoundError:
                raise EngineError(f"{idx}: shard {fname!r} listed in weight_map does not "
                                  "exist") from None
            except OSError as err:
                raise EngineError(f"{p}: {reason(err)}") from None
            if not stat.S_ISREG(mode):
                raise EngineError(f"{p}: not a regular file ({file_kind(mode)})")
            files.append(p)
    if kind == "bin":
        ws = _bin_set(files)
    else:
        entries: dict[str, Entry] = {}
        for p in files:
            for name, e in read_header(p)[0].items():
                if name in entries:
                    raise EngineError(f"{p}: tensor {name!r} also stored in {entries[name].file}")
                entries[name] = e
        ws = WeightSet("safetensors", files, entries)
    for name, fname in wmap.items():
        found = ws.entries.get(name)
        if found is None or found.file.name != Path(str(fname)).name:
            raise EngineError(f"{idx}: tensor {name!r} is not in shard {fname!r}")
    return ws


def _bin_set(files: list[Path]) -> WeightSet:
    state: dict[str, dict[str, torch.Tensor]] = {}
    entries: dict[str, Entry] = {}
    for p in files:
        require_regular(p)  # torch.load would block on a FIFO
        try:
            try:
                sd = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:  # legacy (pre-zip) files cannot be memory-mapped
                if "mmap" not in str(e):
                    raise
                sd = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as e:  # truncated zip, or a pickle that is not plain tensors
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise EngineError(f"{p}: cannot load with weights_only=True ({msg[:200]})") from e
        if not isinstance(sd, dict):
            raise EngineError(f"{p}: holds a {type(sd).__name__}, not a dict of tensors")
        for name, t in sd.items():
            if not isinstance(t, torch.Tensor):
                raise EngineError(f"{p}: entry {name!r} is a {type(t).__name__}, not a tensor")
            if name in entries:
                raise EngineError(f"{p}: tensor {name!r} also stored in {entries[name].file}")
            code = st_code(t.dtype)
            entries[name] = Entry(name, p, code, tuple(t.shape), 0, t.numel() * itemsize(code))
        state[str(p)] = sd
    return WeightSet("bin", files, entries, state)


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw little-endian bytes of a tensor (no copy when already contiguous)."""
    t = t.detach().contiguous().cpu()
    if t.numel() == 0:
        return memoryview(b"")
    return t.reshape(-1).view(torch.uint8).numpy().data.cast("B")


class SafetensorsWriter:
    """Writes a safetensors file whose tensors are supplied in the order they were declared."""

    def __init__(self, path: Path, specs: list[tuple[str, str, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> None:
        header: dict[str, Any] = {"__metadata__": {"format": "pt", **(metadata or {})}}
        self._sizes: list[tuple[str, int]] = []
        pos = 0
        for name, code, shape in specs:
            n = itemsize(code)
            for s in shape:
                n *= s
            header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [pos, pos + n]}
            self._sizes.append((name, n))
            pos += n
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)  # align the data section to 8 bytes, as safetensors does
        self.path = path
        self._f = open(path, "wb", buffering=0)  # noqa: SIM115 -- closed in close()
        self._write_all(len(raw).to_bytes(8, "little") + raw)
        self._i = 0
        self._left = self._sizes[0][1] if self._sizes else 0

    def _write_all(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view:
            n = self._f.write(view)
            view = view[n:]

    def _take(self, name: str, n: int) -> None:
        """Account for n more bytes of tensor `name`, enforcing the declared order."""
        while self._i < len(self._sizes) and self._left == 0 and self._sizes[self._i][0] != name:
            self._advance()
        if self._i >= len(self._sizes) or self._sizes[self._i][0] != name:
            raise RuntimeError(f"writer: tensor {name!r} out of order")
        if n > self._left:
            raise RuntimeError(f"writer: too many bytes for {name!r}")
        self._left -= n

    def write(self, name: str, data: bytes | memoryview) -> None:
        """Append bytes of tensor `name` (may be called several times per tensor)."""
        self._take(name, len(data))
        self._write_all(data)

    def copy_from(self, name: str, src: Path, offset: int, nbytes: int,
                  chunk: int = 8 * CHUNK) -> Iterator[int]:
        """Append `nbytes` of tensor `name` straight from `src` at `offset`, in the kernel
        (sendfile: the bytes never enter Python). Yields the bytes done after each chunk."""
        self._take(name, nbytes)
        done = 0
        with open_regular(src, buffering=0) as f:
            while done < nbytes:
                want = min(chunk, nbytes - done)
                try:
                    n = os.sendfile(self._f.fileno(), f.fileno(), offset + done, want)
                except OSError:  # no sendfile for these files: copy through a buffer
                    f.seek(offset + done)
                    n = len(buf := f.read(want))
                    self._write_all(buf)
                if n == 0:
                    raise EngineError(f"{src}: tensor {name!r}: file shrank while reading")
                done += n
                yield done

    def _advance(self) -> None:
        self._i += 1
        self._left = self._sizes[self._i][1] if self._i < len(self._sizes) else 0

    def close(self, fsync: bool = False) -> None:
        """Finish the file; every declared byte must have been written. Like `cp` and
        save_pretrained, no fsync unless asked: the temp-dir rename already guarantees a reader
        never sees a half-written file; fsync adds power-loss durability at disk speed."""
        while self._i < len(self._sizes) and self._left == 0:
            self._advance()
        if self._i < len(self._sizes):
            self._f.close()
            raise RuntimeError(f"writer: tensor {self._sizes[self._i][0]!r} incomplete")
        if fsync:
            os.fsync(self._f.fileno())
        self._f.close()

    def abort(self) -> None:
        self._f.close()


def save_tensors(path: Path, tensors: dict[str, torch.Tensor],
                 metadata: dict[str, str] | None = None) -> None:
    """Write a whole dict of tensors (small files: vocab maps, test fixtures)."""
    specs = [(k, st_code(v.dtype), tuple(v.shape)) for k, v in tensors.items()]
    w = SafetensorsWriter(path, specs, metadata)
    try:
        for k, v in tensors.items():
            w.write(k, tensor_bytes(v))
        w.close()
    except BaseException:
        w.abort()
        raise
