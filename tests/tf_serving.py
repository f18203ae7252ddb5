"""TensorFlow Serving's REST ``:predict`` in this process: its loader for real, its JSON rules reproduced.

The TensorFlow Serving binary is on neither PyPI nor Debian, so a test cannot start the server Vertex's prebuilt
images run. What can run here, and does:

- **Loading**: ``SavedModel`` opens the export through TensorFlow's C API ``TF_LoadSessionFromSavedModel``,
  which calls the C++ ``tensorflow::LoadSavedModel`` that TensorFlow Serving's SavedModel bundle loader calls
  (the graph from the MetaGraphDef tagged ``serve``, the variables restored by the saver's restore op, the
  ``__saved_model_init_op`` run); a signature runs as a ``Session::Run`` on the tensor names its SignatureDef
  lists, as TF Serving's predict does. (TensorFlow's Python ``tf.compat.v1`` loader is no stand-in: it skips
  the restore for a TF2 SavedModel, whose variables are in no collection.)
- **JSON**: ``predict(model, body)`` decodes a request and encodes the answer with the rules of
  ``tensorflow_serving/util/json_tensor.cc`` and ``g3doc/api_rest.md``: an optional ``signature_name`` (else
  ``serving_default``); exactly one of ``instances`` (row format: for a single-input signature each element is
  the input's value, or an object keyed by input names; every element batched along a new first dimension) or
  ``inputs`` (columnar); a ``{"b64": "..."}`` object (that one key, a string) only where the tensor is
  DT_STRING, decoded from standard base64; a row answer is ``{"predictions": [...]}``, one object per batch
  element keyed by output name (the bare value for a single output), every output sharing the first
  dimension; a DT_STRING output whose name ends in ``_bytes`` is written as ``{"b64": ...}``, any other as a
  JSON string; a float with six significant digits where they read back as the same float32, else nine. An
  error is ``RestError`` with TF Serving's message shape.

Only the dtypes this project's signatures use are converted: DT_STRING, DT_FLOAT, DT_INT32, DT_INT64.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import os
from typing import Any

import numpy as np
from tensorflow.core.framework import types_pb2
from tensorflow.core.protobuf import meta_graph_pb2

DEFAULT_SIGNATURE = "serving_default"
BYTES_SUFFIX = "_bytes"

# TF_DataType values of tensorflow/c/tf_datatype.h (the same numbers as types_pb2.DataType).
_NUMPY = {types_pb2.DT_FLOAT: np.float32, types_pb2.DT_INT32: np.int32, types_pb2.DT_INT64: np.int64}
_TSTRING_SIZE = 24  # sizeof(TF_TString) on a 64-bit host (tensorflow/core/platform/ctstring_internal.h)


class RestError(ValueError):
    """What TF Serving answers with HTTP 400: ``{"error": message}``."""


class _Buffer(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("length", ctypes.c_size_t), ("data_deallocator", ctypes.c_void_p)]


class _Output(ctypes.Structure):
    _fields_ = [("oper", ctypes.c_void_p), ("index", ctypes.c_int)]


def _c_api() -> ctypes.CDLL:
    import tensorflow as tf

    lib = ctypes.CDLL(os.path.join(tf.sysconfig.get_lib(), "libtensorflow_cc.so.2"))
    p, i, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    for name, restype, argtypes in (
        ("TF_NewStatus", p, []),
        ("TF_DeleteStatus", None, [p]),
        ("TF_GetCode", i, [p]),
        ("TF_Message", ctypes.c_char_p, [p]),
        ("TF_NewSessionOptions", p, []),
        ("TF_DeleteSessionOptions", None, [p]),
        ("TF_NewGraph", p, []),
        ("TF_DeleteGraph", None, [p]),
        ("TF_NewBuffer", ctypes.POINTER(_Buffer), []),
        ("TF_DeleteBuffer", None, [ctypes.POINTER(_Buffer)]),
        (
            "TF_LoadSessionFromSavedModel",
            p,
            [p, p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), i, p, ctypes.POINTER(_Buffer), p],
        ),  # fmt: skip
        ("TF_CloseSession", None, [p, p]),
        ("TF_DeleteSession", None, [p, p]),
        ("TF_GraphOperationByName", p, [p, ctypes.c_char_p]),
        (
            "TF_SessionRun",
            None,
            [
                p,
                p,
                ctypes.POINTER(_Output),
                ctypes.POINTER(p),
                i,
                ctypes.POINTER(_Output),
                ctypes.POINTER(p),
                i,
                p,
                i,
                p,
                p,
            ],
        ),  # fmt: skip
        ("TF_AllocateTensor", p, [i, ctypes.POINTER(ctypes.c_int64), i, size]),
        ("TF_DeleteTensor", None, [p]),
        ("TF_TensorData", p, [p]),
        ("TF_TensorByteSize", size, [p]),
        ("TF_TensorType", i, [p]),
        ("TF_NumDims", i, [p]),
        ("TF_Dim", ctypes.c_int64, [p, i]),
        ("TF_StringInit", None, [p]),
        ("TF_StringCopy", None, [p, ctypes.c_char_p, size]),
        ("TF_StringGetDataPointer", p, [p]),
        ("TF_StringGetSize", size, [p]),
    ):
        function = getattr(lib, name)
        function.restype, function.argtypes = restype, argtypes
    return lib


class SavedModel:
    """A SavedModel loaded as TF Serving loads it; ``run`` calls one signature on numpy inputs."""

    def __init__(self, export_dir: str):
        self._lib = lib = _c_api()
        status, options, meta = lib.TF_NewStatus(), lib.TF_NewSessionOptions(), lib.TF_NewBuffer()
        self._graph = lib.TF_NewGraph()
        tags = (ctypes.c_char_p * 1)(b"serve")
        try:
            self._session = lib.TF_LoadSessionFromSavedModel(
                options, None, export_dir.encode(), tags, 1, self._graph, meta, status
            )
            self._check(status)
            graph = meta_graph_pb2.MetaGraphDef.FromString(
                ctypes.string_at(meta.contents.data, meta.contents.length)
            )
        finally:
            lib.TF_DeleteBuffer(meta)
            lib.TF_DeleteSessionOptions(options)
            lib.TF_DeleteStatus(status)
        self.signatures = {k: v for k, v in graph.signature_def.items() if not k.startswith("__")}

    def _check(self, status) -> None:
        if self._lib.TF_GetCode(status) != 0:
            raise RuntimeError(self._lib.TF_Message(status).decode())

    def _output(self, tensor_name: str) -> _Output:
        operation, _, index = tensor_name.partition(":")
        handle = self._lib.TF_GraphOperationByName(self._graph, operation.encode())
        if not handle:
            raise RuntimeError(f"no operation {operation} in the graph")
        return _Output(handle, int(index or 0))

    def _tensor(self, value: np.ndarray, dtype: int):
        lib, dims = self._lib, (ctypes.c_int64 * value.ndim)(*value.shape)
        if dtype == types_pb2.DT_STRING:
            flat = value.reshape(-1)
            tensor = lib.TF_AllocateTensor(dtype, dims, value.ndim, _TSTRING_SIZE * flat.size)
            base = lib.TF_TensorData(tensor)
            for position, item in enumerate(flat):
                lib.TF_StringInit(base + position * _TSTRING_SIZE)
                lib.TF_StringCopy(base + position * _TSTRING_SIZE, item, len(item))
            return tensor
        data = np.ascontiguousarray(value, dtype=_NUMPY[dtype])
        tensor = lib.TF_AllocateTensor(dtype, dims, value.ndim, data.nbytes)
        ctypes.memmove(lib.TF_TensorData(tensor), data.ctypes.data, data.nbytes)
        return tensor

    def _array(self, tensor) -> np.ndarray:
        lib = self._lib
        shape = tuple(lib.TF_Dim(tensor, d) for d in range(lib.TF_NumDims(tensor)))
        dtype, base = lib.TF_TensorType(tensor), lib.TF_TensorData(tensor)
        if dtype == types_pb2.DT_STRING:
            count = int(np.prod(shape, dtype=np.int64))
            items = [
                ctypes.string_at(
                    lib.TF_StringGetDataPointer(base + k * _TSTRING_SIZE),
                    lib.TF_StringGetSize(base + k * _TSTRING_SIZE),
                )
                for k in range(count)
            ]
            return np.array(items, dtype=object).reshape(shape)
        raw = ctypes.string_at(base, lib.TF_TensorByteSize(tensor))
        return np.frombuffer(raw, dtype=_NUMPY[dtype]).reshape(shape).copy()

    def run(self, signature_name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Runs ``signature_name`` with ``inputs`` by input name; the outputs by output name."""
        signature = self.signatures[signature_name]
        names = sorted(signature.outputs)
        feeds = [
            (self._output(signature.inputs[k].name), self._tensor(v, signature.inputs[k].dtype))
            for k, v in inputs.items()
        ]
        lib, status = self._lib, self._lib.TF_NewStatus()
        results = (ctypes.c_void_p * len(names))()
        try:
            lib.TF_SessionRun(
                self._session,
                None,
                (_Output * len(feeds))(*[f[0] for f in feeds]),
                (ctypes.c_void_p * len(feeds))(*[f[1] for f in feeds]),
                len(feeds),
                (_Output * len(names))(*[self._output(signature.outputs[n].name) for n in names]),
                results,
                len(names),
                None,
                0,
                None,
                status,
            )
            self._check(status)
            return {name: self._array(results[k]) for k, name in enumerate(names)}
        finally:
            for _, tensor in feeds:
                lib.TF_DeleteTensor(tensor)
            for tensor in results:
                if tensor:
                    lib.TF_DeleteTensor(tensor)
            lib.TF_DeleteStatus(status)

    def close(self) -> None:
        status = self._lib.TF_NewStatus()
        self._lib.TF_CloseSession(self._session, status)
        self._lib.TF_DeleteSession(self._session, status)
        self._lib.TF_DeleteGraph(self._graph)
        self._lib.TF_DeleteStatus(status)


# ---- the REST JSON codec (tensorflow_serving/util/json_tensor.cc) -------------------------------------------


def _is_b64(value) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _leaf(value, dtype: int):
    if isinstance(value, dict):
        if dtype != types_pb2.DT_STRING or not _is_b64(value):
            raise RestError(f"JSON Value: {value} not formatted correctly for base64 data")
        try:
            return base64.b64decode(value["b64"], validate=True)
        except binascii.Error as e:
            raise RestError("Unable to base64 decode") from e
    if dtype == types_pb2.DT_STRING:
        if not isinstance(value, str):
            raise RestError(f"JSON Value: {value} is not of expected type: string")
        return value.encode()
    if isinstance(value, bool | str) or not isinstance(value, int | float):
        raise RestError(f"JSON Value: {value} is not of expected type: {types_pb2.DataType.Name(dtype)}")
    if dtype != types_pb2.DT_FLOAT and not isinstance(value, int):
        raise RestError(f"JSON Value: {value} is not of expected type: {types_pb2.DataType.Name(dtype)}")
    return value


def _tensor_value(value, dtype: int) -> np.ndarray:
    """A (nested) JSON value as a dense array: every list at one level of one length, leaves at the same depth."""

    def shape(v) -> tuple[int, ...]:
        return (len(v), *shape(v[0])) if isinstance(v, list) and v else ((0,) if isinstance(v, list) else ())

    dims = shape(value)

    def fill(v, level: int) -> list:
        if not isinstance(v, list):
            if level != len(dims):
                raise RestError(f"JSON Value: {v} found at incorrect level: {level + 1}")
            return [_leaf(v, dtype)]
        if level >= len(dims) or len(v) != dims[level]:
            raise RestError(f"Encountered list at unexpected size: {len(v)} at level: {level}")
        return [leaf for item in v for leaf in fill(item, level + 1)]

    leaves = fill(value, 0)
    if dtype == types_pb2.DT_STRING:
        return np.array(leaves, dtype=object).reshape(dims)
    return np.array(leaves, dtype=_NUMPY[dtype]).reshape(dims)


def _instances(instances: list, inputs) -> dict[str, np.ndarray]:
    if not isinstance(instances, list):
        raise RestError("Excepting 'instances' to be an list/array")
    if not instances:
        raise RestError("No values in 'instances' array")
    objects = isinstance(instances[0], dict) and not _is_b64(instances[0])
    if not objects and len(inputs) > 1:
        raise RestError(
            "instances is a plain list, but expecting list of objects as multiple input tensors required"
        )
    rows: dict[str, list[np.ndarray]] = {name: [] for name in inputs}
    for position, element in enumerate(instances):
        if objects != (isinstance(element, dict) and not _is_b64(element)):
            raise RestError(
                f"Expecting {'object' if objects else 'value/list'} at item {position} of input list"
            )
        named = element if objects else {next(iter(inputs)): element}
        if set(named) != set(inputs):
            raise RestError(
                f"Failed to process element: {position}: keys must be equal to: {','.join(sorted(inputs))}"
            )
        for name, value in named.items():
            rows[name].append(_tensor_value(value, inputs[name].dtype))
    for name, values in rows.items():
        if len({v.shape for v in values}) > 1:
            raise RestError(f"Expecting shape {values[0].shape} but got another for input {name}")
    return {name: np.stack(values) for name, values in rows.items()}


def _columns(value, inputs) -> dict[str, np.ndarray]:
    if not isinstance(value, dict) or _is_b64(value):
        if len(inputs) > 1:
            raise RestError(
                "inputs is a plain value/list, but expecting an object as multiple input tensors required"
            )
        name = next(iter(inputs))
        return {name: _tensor_value(value, inputs[name].dtype)}
    missing = [name for name in inputs if name not in value]
    if missing:
        raise RestError(f"Missing named input: {missing[0]} in 'inputs' object.")
    return {name: _tensor_value(value[name], inputs[name].dtype) for name in inputs}


def _decimal(value: np.floating) -> float:
    """A float as TF Serving writes it (``WriteDecimal``): six significant digits where they read back as the
    same number, else the type's full precision (9 digits for float32)."""
    text = f"{value:.6g}"
    if type(value)(text) != value:
        text = f"{value:.{9 if value.dtype == np.float32 else 17}g}"  # std::numeric_limits<T>::max_digits10
    return float(text)


def _json_value(value: np.ndarray, as_bytes: bool) -> Any:
    if isinstance(value, np.ndarray) and value.ndim:
        return [_json_value(v, as_bytes) for v in value]
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()} if as_bytes else value.decode("utf-8")
    if isinstance(value, np.floating) and np.isfinite(value):
        return _decimal(value)
    return value.item()


def predict(model: SavedModel, body: dict) -> dict:
    """The answer TF Serving's ``POST /v1/models/NAME:predict`` gives to ``body``."""
    if not isinstance(body, dict):
        raise RestError("JSON Value: Is not object")
    name = body.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(name, str):
        raise RestError("'signature_name' key must be a string value.")
    if name not in model.signatures:
        raise RestError(f'Serving signature name: "{name}" not found in signature def')
    inputs = model.signatures[name].inputs
    if ("instances" in body) == ("inputs" in body):
        both = "instances" in body
        raise RestError(
            "expecting only one of 'inputs' or 'instances'" if both else "Missing 'inputs' or 'instances' key"
        )
    row = "instances" in body
    tensors = _instances(body["instances"], inputs) if row else _columns(body["inputs"], inputs)
    outputs = model.run(name, tensors)
    as_bytes = {k: k.endswith(BYTES_SUFFIX) and v.dtype == object for k, v in outputs.items()}
    if not row:
        columns = {k: _json_value(v, as_bytes[k]) for k, v in outputs.items()}
        return {"outputs": next(iter(columns.values())) if len(columns) == 1 else columns}
    batch = {k: v.shape[0] for k, v in outputs.items() if v.ndim}
    if len(batch) != len(outputs) or len(set(batch.values())) != 1:
        raise RestError(f"Tensors have no or inconsistent batch sizes: {batch}")
    rows = [
        {k: _json_value(v[i], as_bytes[k]) for k, v in outputs.items()}
        for i in range(next(iter(batch.values())))
    ]
    return {"predictions": [next(iter(r.values())) for r in rows] if len(outputs) == 1 else rows}
