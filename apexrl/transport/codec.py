"""Wire codec: a message dataclass <-> a list of ZeroMQ frames.

Frame 0 is a msgpack header::

    {"v": SCHEMA_VERSION, "kind": "TrajectoryChunk",
     "scalars": {"table": "replay", "actor_id": 3, ...},  # int, float, bool, str, dict[str, float]
     "arrays": [{"name": "priorities", "dtype": "<f8", "shape": [32], "codec": "raw",
                 "nbytes": 256, "raw_nbytes": 256},
                {"name": "fields.obs", "dtype": "|u1", "shape": [32, 84, 84], "codec": "lz4",
                 "nbytes": 40112, "raw_nbytes": 225792}, ...]}

and frames 1..n hold the bytes of those arrays, in order. An array is sent ``raw`` (its C-order
bytes) or ``lz4`` (an LZ4 block without a stored size; the header's ``raw_nbytes`` gives it). An
array in a ``dict[str, np.ndarray]`` field is named ``<field>.<key>``; the name splits at the first
dot, so keys may hold dots (``arrays.torso.0.weight``) but may not be empty.

``decode`` trusts nothing: every size is bounded by ``Limits`` before anything is allocated, every
field is checked against the message class, and any failure raises ``DecodeError``. There is no
pickle, no msgpack ext types and no object dtype anywhere.

Decoded arrays are **read-only**: raw arrays are views of the received frames (no copy), LZ4
arrays are views of the decompressed bytes. Consumers copy them into their own storage.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lz4.block
import msgpack
import numpy as np
import zmq

from apexrl.transport import messages
from apexrl.transport.messages import MESSAGE_TYPES, SCHEMA_VERSION, Message

__all__ = [
    "ALLOWED_DTYPES",
    "DEFAULT_LIMITS",
    "DecodeError",
    "Limits",
    "NotPermitted",
    "decode",
    "encode",
]


class DecodeError(ValueError):
    """Frames that are not a valid message: the one error ``decode`` raises for bad input."""


class NotPermitted(DecodeError):
    """A valid header of a message kind the sender may not send (``decode``'s ``kinds``)."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"may not send {kind}")
        self.kind = kind


ALLOWED_DTYPES: frozenset[np.dtype] = frozenset(
    np.dtype(name).newbyteorder("<")
    for name in (
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
)
# Decode matches the header's dtype string exactly against these ("|u1", "<f4", ...), so no other
# string ever reaches np.dtype().
_DTYPE_BY_STR: dict[str, np.dtype] = {dtype.str: dtype for dtype in ALLOWED_DTYPES}

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_HEADER_KEYS = frozenset({"v", "kind", "scalars", "arrays"})
_DESCRIPTOR_KEYS = frozenset({"name", "dtype", "shape", "codec", "nbytes", "raw_nbytes"})
_CODECS = ("raw", "lz4")


@dataclass(frozen=True)
class Limits:
    """Upper bounds that ``decode`` enforces before allocating anything."""

    max_message_bytes: int = 512 * 2**20  # bytes, all frames together, and all arrays decompressed
    max_frames: int = 1024  # frames per message, header included
    max_array_bytes: int = 256 * 2**20  # bytes, one array after decompression
    max_header_bytes: int = 2**20  # bytes, the msgpack header frame
    max_ndim: int = 8  # dimensions per array


DEFAULT_LIMITS = Limits()


# --- the per-class field plan -------------------------------------------------------------------

# Field kinds, found from the dataclass annotations.
_INT, _FLOAT, _BOOL, _STR = "int", "float", "bool", "str"
_FLOAT_DICT, _ARRAY, _ARRAY_DICT = "float_dict", "array", "array_dict"
_SCALAR_KINDS = {int: _INT, float: _FLOAT, bool: _BOOL, str: _STR}


@dataclass(frozen=True)
class _Plan:
    """How one message class maps onto the header: field name -> kind."""

    cls: type
    kinds: dict[str, str]
    scalar_names: frozenset[str]  # scalar and dict[str, float] fields: the header's "scalars"
    array_names: frozenset[str]  # np.ndarray fields: exactly one descriptor each
    array_dict_names: frozenset[str]  # dict[str, np.ndarray] fields: "<field>.<key>" descriptors


def _field_kind(cls: type, name: str, hint: Any) -> str:
    if hint in _SCALAR_KINDS:
        return _SCALAR_KINDS[hint]
    if hint is np.ndarray:
        return _ARRAY
    if hint == dict[str, np.ndarray]:
        return _ARRAY_DICT
    if hint == dict[str, float]:
        return _FLOAT_DICT
    raise TypeError(f"{cls.__name__}.{name}: the codec cannot carry type {hint!r}")


@functools.cache
def _plan(cls: type) -> _Plan:
    hints = typing.get_type_hints(cls, vars(messages))
    kinds = {f.name: _field_kind(cls, f.name, hints[f.name]) for f in dataclasses.fields(cls)}
    return _Plan(
        cls=cls,
        kinds=kinds,
        scalar_names=frozenset(n for n, k in kinds.items() if k not in (_ARRAY, _ARRAY_DICT)),
        array_names=frozenset(n for n, k in kinds.items() if k == _ARRAY),
        array_dict_names=frozenset(n for n, k in kinds.items() if k == _ARRAY_DICT),
    )


# --- encode -------------------------------------------------------------------------------------


def _encode_int(where: str, value: Any) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{where} must be an int, got {type(value).__name__}")
    value = int(value)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(f"{where} = {value} does not fit in int64")
    return value


def _encode_float(where: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"{where} must be a float, got {type(value).__name__}")
    if isinstance(value, np.complexfloating):
        raise TypeError(f"{where} must be a real number, got {type(value).__name__}")
    return float(value)


def _encode_scalar(where: str, kind: str, value: Any) -> Any:
    if kind == _INT:
        return _encode_int(where, value)
    if kind == _FLOAT:
        return _encode_float(where, value)
    if kind == _BOOL:
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{where} must be a bool, got {type(value).__name__}")
        return bool(value)
    if kind == _STR:
        if not isinstance(value, str):
            raise TypeError(f"{where} must be a str, got {type(value).__name__}")
        return value
    # _FLOAT_DICT
    if not isinstance(value, dict):
        raise TypeError(f"{where} must be a dict[str, float], got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise TypeError(f"{where} keys must be str, got {key!r}")
    return {key: _encode_float(f"{where}[{key!r}]", v) for key, v in value.items()}


def _encode_array(
    name: str, array: Any, compress_min_bytes: int
) -> tuple[dict[str, Any], bytes | memoryview]:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be an np.ndarray, got {type(array).__name__}")
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    if dtype not in ALLOWED_DTYPES:
        raise ValueError(f"{name} has dtype {array.dtype}, which the wire does not carry")
    # No copy when the array is already C-contiguous little-endian.
    contiguous = np.asarray(array, dtype=dtype, order="C")
    data = memoryview(contiguous.reshape(-1).view(np.uint8))
    raw_nbytes = data.nbytes
    frame: bytes | memoryview = data
    codec = "raw"
    if raw_nbytes >= compress_min_bytes:
        compressed = lz4.block.compress(data, store_size=False)
        if len(compressed) < raw_nbytes:
            frame, codec = compressed, "lz4"
    descriptor = {
        "name": name,
        "dtype": dtype.str,
        "shape": list(array.shape),
        "codec": codec,
        "nbytes": len(frame) if codec == "lz4" else raw_nbytes,
        "raw_nbytes": raw_nbytes,
    }
    return descriptor, frame


def encode(msg: Message, *, compress_min_bytes: int = 16384) -> list[bytes | memoryview]:
    """Encode ``msg`` as ``[header, array_0, ..., array_n]``.

    Arrays of at least ``compress_min_bytes`` bytes are LZ4-compressed when that shrinks them;
    the others are memoryviews of the message's own arrays (no copy when C-contiguous), so the
    arrays must not be modified until the frames are sent. A value of the wrong type raises
    ``TypeError`` or ``ValueError``: that is a bug in the sender, not bad input.
    """
    cls = type(msg)
    if MESSAGE_TYPES.get(cls.__name__) is not cls:
        raise TypeError(f"{cls.__name__} is not a message type (see messages.MESSAGE_TYPES)")
    plan = _plan(cls)
    scalars: dict[str, Any] = {}
    descriptors: list[dict[str, Any]] = []
    frames: list[bytes | memoryview] = []
    for name, kind in plan.kinds.items():
        value = getattr(msg, name)
        where = f"{cls.__name__}.{name}"
        if kind == _ARRAY:
            descriptor, frame = _encode_array(name, value, compress_min_bytes)
            descriptors.append(descriptor)
            frames.append(frame)
        elif kind == _ARRAY_DICT:
            if not isinstance(value, dict):
                raise TypeError(f"{where} must be a dict[str, np.ndarray]")
            for key, array in value.items():
                if not isinstance(key, str) or not key:
                    raise ValueError(f"{where} key {key!r} must be a non-empty str")
                descriptor, frame = _encode_array(f"{name}.{key}", array, compress_min_bytes)
                descriptors.append(descriptor)
                frames.append(frame)
        else:
            scalars[name] = _encode_scalar(where, kind, value)
    header = {"v": SCHEMA_VERSION, "kind": cls.__name__, "scalars": scalars, "arrays": descriptors}
    return [msgpack.packb(header, use_bin_type=True), *frames]


# --- decode -------------------------------------------------------------------------------------


def _as_bytes_view(frame: bytes | memoryview | zmq.Frame) -> memoryview:
    if type(frame) is zmq.Frame:  # what a socket gives: a flat byte buffer
        view = frame.buffer
        if view.format == "B" and view.ndim == 1:
            return view
    elif isinstance(frame, zmq.Frame):
        view = frame.buffer
    elif isinstance(frame, (bytes, bytearray, memoryview)):
        view = memoryview(frame)
    else:
        raise TypeError(f"a frame must be bytes, memoryview or zmq.Frame, got {type(frame)}")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _brief(value: Any) -> str:
    """A bounded repr of an untrusted value, for error messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _key_mismatch(where: str, got: Any, expected: frozenset[str]) -> DecodeError:
    if not isinstance(got, dict):
        return DecodeError(f"{where} must be a map, got {type(got).__name__}")
    missing = sorted(expected - set(got))
    unexpected = [key for key in got if key not in expected]
    return DecodeError(f"{where}: missing {missing}, unexpected {_brief(unexpected)}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _unpack_header(view: memoryview, limits: Limits) -> dict[str, Any]:
    if view.nbytes > limits.max_header_bytes:
        raise DecodeError(
            f"header is {view.nbytes} bytes, over the limit of {limits.max_header_bytes}"
        )
    bound = limits.max_header_bytes
    try:
        header = msgpack.unpackb(
            view,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=bound,
            max_bin_len=0,  # the header has no binary fields
            max_array_len=bound,
            max_map_len=bound,
            max_ext_len=0,  # no ext types at all
        )
    except Exception as exc:  # msgpack raises many types for bad input; all mean "not a header"
        raise DecodeError(f"header is not valid msgpack ({type(exc).__name__}: {exc})") from exc
    if not isinstance(header, dict):
        raise DecodeError(f"header must be a msgpack map, got {type(header).__name__}")
    if set(header) != _HEADER_KEYS:
        raise _key_mismatch("header", header, _HEADER_KEYS)
    version = header["v"]
    if not _is_int(version) or version != SCHEMA_VERSION:
        raise DecodeError(
            f"schema version {_brief(version)} does not match ours ({SCHEMA_VERSION})"
        )
    return header


def _decode_scalar(where: str, kind: str, value: Any) -> Any:
    if kind == _INT:
        if not _is_int(value):
            raise DecodeError(f"{where} must be an int, got {type(value).__name__}")
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise DecodeError(f"{where} = {value} does not fit in int64")
        return value
    if kind == _FLOAT:
        if not (isinstance(value, float) or _is_int(value)):
            raise DecodeError(f"{where} must be a float, got {type(value).__name__}")
        return float(value)
    if kind == _BOOL:
        if not isinstance(value, bool):
            raise DecodeError(f"{where} must be a bool, got {type(value).__name__}")
        return value
    if kind == _STR:
        if not isinstance(value, str):
            raise DecodeError(f"{where} must be a str, got {type(value).__name__}")
        return value
    # _FLOAT_DICT
    if not isinstance(value, dict):
        raise DecodeError(f"{where} must be a map of str to float, got {type(value).__name__}")
    result = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise DecodeError(f"{where} has a non-str key {_brief(key)}")
        result[key] = _decode_scalar(f"{where}[{_brief(key)}]", _FLOAT, item)
    return result


def _check_descriptor(index: int, descriptor: Any, limits: Limits) -> tuple[np.dtype, list[int]]:
    """Validate one array descriptor's types and sizes; return its dtype and shape.

    A fast path accepts only what ``_explain_descriptor`` accepts (exact ``int`` and ``str``
    types, the same bounds) without building error texts; anything else goes to it, which returns
    the same result or raises ``DecodeError`` with the reason.
    """
    if type(descriptor) is dict and descriptor.keys() == _DESCRIPTOR_KEYS:
        shape, nbytes, raw_nbytes = (
            descriptor["shape"],
            descriptor["nbytes"],
            descriptor["raw_nbytes"],
        )
        dtype = _DTYPE_BY_STR.get(descriptor["dtype"]) if type(descriptor["dtype"]) is str else None
        codec = descriptor["codec"]
        if (
            dtype is not None
            and type(descriptor["name"]) is str
            and type(shape) is list
            and len(shape) <= limits.max_ndim
            and _is_bounded_shape(shape, limits.max_array_bytes)
            and type(codec) is str
            and codec in _CODECS
            and type(nbytes) is int
            and nbytes >= 0
            and type(raw_nbytes) is int
            and math.prod(shape) * dtype.itemsize == raw_nbytes
            and raw_nbytes <= limits.max_array_bytes
            and (codec != "raw" or nbytes == raw_nbytes)
        ):
            return dtype, shape
    return _explain_descriptor(index, descriptor, limits)


def _is_bounded_shape(shape: list[Any], bound: int) -> bool:
    """Whether every dimension is an ``int`` (not a bool) in ``0..bound``."""
    for d in shape:
        if type(d) is not int or not 0 <= d <= bound:
            return False
    return True


def _explain_descriptor(index: int, descriptor: Any, limits: Limits) -> tuple[np.dtype, list[int]]:
    """``_check_descriptor``'s full path: every check, with the reason of a failure."""
    where = f"array descriptor {index}"
    if not isinstance(descriptor, dict) or set(descriptor) != _DESCRIPTOR_KEYS:
        raise _key_mismatch(where, descriptor, _DESCRIPTOR_KEYS)
    name, dtype_str, shape = descriptor["name"], descriptor["dtype"], descriptor["shape"]
    codec, nbytes, raw_nbytes = descriptor["codec"], descriptor["nbytes"], descriptor["raw_nbytes"]
    if not isinstance(name, str):
        raise DecodeError(f"{where}: name must be a str, got {type(name).__name__}")
    where = f"array {_brief(name)}"
    if not isinstance(dtype_str, str) or dtype_str not in _DTYPE_BY_STR:
        raise DecodeError(f"{where}: dtype {_brief(dtype_str)} is not allowed")
    if not isinstance(shape, list):
        raise DecodeError(f"{where}: shape must be a list, got {type(shape).__name__}")
    if len(shape) > limits.max_ndim:
        raise DecodeError(f"{where}: {len(shape)} dimensions, over the limit of {limits.max_ndim}")
    if not all(_is_int(d) and d >= 0 for d in shape):
        raise DecodeError(f"{where}: shape {_brief(shape)} must be non-negative ints")
    # A zero elsewhere makes any product 0 bytes; no dimension can still exceed what one array
    # may hold (numpy refuses dimensions beyond its own limits with a ValueError).
    if any(d > limits.max_array_bytes for d in shape):
        raise DecodeError(
            f"{where}: dimension {max(shape)} is over the limit of {limits.max_array_bytes}"
        )
    if codec not in _CODECS:
        raise DecodeError(f"{where}: codec {_brief(codec)} is not one of {_CODECS}")
    if not (_is_int(nbytes) and nbytes >= 0 and _is_int(raw_nbytes) and raw_nbytes >= 0):
        raise DecodeError(f"{where}: nbytes and raw_nbytes must be non-negative ints")
    dtype = _DTYPE_BY_STR[dtype_str]
    if math.prod(shape) * dtype.itemsize != raw_nbytes:
        raise DecodeError(
            f"{where}: shape {shape} of {dtype_str} is {math.prod(shape) * dtype.itemsize} bytes,"
            f" but raw_nbytes is {raw_nbytes}"
        )
    if raw_nbytes > limits.max_array_bytes:
        raise DecodeError(
            f"{where}: {raw_nbytes} bytes, over the limit of {limits.max_array_bytes} per array"
        )
    if codec == "raw" and nbytes != raw_nbytes:
        raise DecodeError(f"{where}: raw codec but nbytes {nbytes} != raw_nbytes {raw_nbytes}")
    return dtype, shape


def _decode_array(
    descriptor: dict[str, Any], dtype: np.dtype, shape: list[int], data: memoryview
) -> np.ndarray:
    name, nbytes, raw_nbytes = descriptor["name"], descriptor["nbytes"], descriptor["raw_nbytes"]
    if data.nbytes != nbytes:
        raise DecodeError(
            f"array {_brief(name)}: frame is {data.nbytes} bytes, header says {nbytes}"
        )
    buffer: bytes | memoryview
    if descriptor["codec"] == "lz4":
        try:
            # raw_nbytes is already bounded by Limits.max_array_bytes: this allocation is capped.
            buffer = lz4.block.decompress(data, uncompressed_size=raw_nbytes)
        except (lz4.block.LZ4BlockError, ValueError) as exc:
            raise DecodeError(f"array {_brief(name)}: bad LZ4 data: {exc}") from exc
        if len(buffer) != raw_nbytes:
            raise DecodeError(
                f"array {_brief(name)}: LZ4 gave {len(buffer)} bytes, expected {raw_nbytes}"
            )
    else:
        buffer = data.toreadonly()
    try:
        # A read-only buffer gives a read-only array: no flag to set afterwards.
        return np.ndarray(shape, dtype, buffer)
    except (ValueError, TypeError) as exc:  # unreachable after the checks; a last line of defence
        raise DecodeError(f"array {_brief(name)}: {exc}") from exc


def _place_arrays(
    plan: _Plan, names: list[str], arrays: list[np.ndarray]
) -> dict[str, np.ndarray | dict[str, np.ndarray]]:
    """Map descriptor names onto the message's array fields, exactly."""
    values: dict[str, Any] = {name: {} for name in plan.array_dict_names}
    for name, array in zip(names, arrays, strict=True):
        if name in plan.array_names:
            if name in values:
                raise DecodeError(f"array {_brief(name)} appears twice")
            values[name] = array
            continue
        field_name, dot, key = name.partition(".")
        if not dot or field_name not in plan.array_dict_names or not key:
            raise DecodeError(f"{plan.cls.__name__} has no array field {_brief(name)}")
        if key in values[field_name]:
            raise DecodeError(f"array {_brief(name)} appears twice")
        values[field_name][key] = array
    missing = plan.array_names - set(values)
    if missing:
        raise DecodeError(f"{plan.cls.__name__} is missing array fields {sorted(missing)}")
    return values


def decode(
    frames: Sequence[bytes | memoryview | zmq.Frame],
    limits: Limits = DEFAULT_LIMITS,
    kinds: frozenset[str] | None = None,
) -> Message:
    """Decode and validate the frames of one message (without any ROUTER identity frame).

    Raises ``DecodeError`` for any malformed, oversized or inconsistent input, including a
    message whose ``__post_init__`` rejects it. Arrays in the result are read-only. With
    ``kinds``, a message of another kind is refused from its header (``NotPermitted``), before
    any array is looked at or decompressed.
    """
    if len(frames) == 0:
        raise DecodeError("no frames")
    if len(frames) > limits.max_frames:
        raise DecodeError(f"{len(frames)} frames, over the limit of {limits.max_frames}")
    views = [_as_bytes_view(frame) for frame in frames]
    total_bytes = sum(map(len, views))  # flat byte views: len is nbytes
    if total_bytes > limits.max_message_bytes:
        raise DecodeError(f"{total_bytes} bytes, over the limit of {limits.max_message_bytes}")

    header = _unpack_header(views[0], limits)
    kind = header["kind"]
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        raise DecodeError(f"unknown message kind {_brief(kind)}")
    if kinds is not None and kind not in kinds:
        raise NotPermitted(kind)
    plan = _plan(MESSAGE_TYPES[kind])

    scalars = header["scalars"]
    if not isinstance(scalars, dict) or set(scalars) != plan.scalar_names:
        raise _key_mismatch(f"{kind} scalars", scalars, plan.scalar_names)
    values: dict[str, Any] = {}
    for name, value in scalars.items():
        field_kind = plan.kinds[name]
        if field_kind == _INT and type(value) is int and _INT64_MIN <= value <= _INT64_MAX:
            values[name] = value  # the common case, without building the error's prefix
        else:
            values[name] = _decode_scalar(f"{kind}.{name}", field_kind, value)

    descriptors = header["arrays"]
    if not isinstance(descriptors, list):
        raise DecodeError(f"header 'arrays' must be a list, got {type(descriptors).__name__}")
    if len(descriptors) != len(views) - 1:
        raise DecodeError(f"{len(descriptors)} array descriptors but {len(views) - 1} array frames")
    checked = [_check_descriptor(i, d, limits) for i, d in enumerate(descriptors)]
    # Bound the decompressed total too, so many small LZ4 frames cannot expand without limit.
    raw_total = sum([d["raw_nbytes"] for d in descriptors])
    if raw_total > limits.max_message_bytes:
        raise DecodeError(
            f"arrays total {raw_total} bytes decompressed, over {limits.max_message_bytes}"
        )
    names = [d["name"] for d in descriptors]
    arrays = [
        _decode_array(d, dtype, shape, view)
        for d, (dtype, shape), view in zip(descriptors, checked, views[1:], strict=True)
    ]
    values.update(_place_arrays(plan, names, arrays))
    try:
        return plan.cls(**values)
    except (ValueError, TypeError) as exc:
        raise DecodeError(f"invalid {kind}: {exc}") from exc
