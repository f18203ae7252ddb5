"""tf.train.Example encoding, decoding and TFRecord framing in plain Python, so Beam workers never import
TensorFlow.

Importing TensorFlow is costly in time and memory for every worker process (docs/performance.md,
'Sharding'); the few message types and the record framing written by hand are byte-for-byte what TensorFlow
writes (the tests compare them with ``tf.train.Example.SerializeToString(deterministic=True)`` and
``tf.io.TFRecordWriter``).

Wire format (protobuf): Example{1: Features}; Features{1: map<string, Feature>} written as repeated entries
{1: key, 2: value} in key order (deterministic serialization); Feature{1: BytesList{1: repeated bytes},
3: Int64List{1: packed int64}}. TFRecord: uint64 length, masked CRC32C of the length, data, masked CRC32C of
the data, little-endian.
"""

from __future__ import annotations

import functools
import struct

import google_crc32c

_LENGTH_DELIMITED_1 = b"\x0a"  # field 1, wire type 2
_LENGTH_DELIMITED_2 = b"\x12"  # field 2, wire type 2
_LENGTH_DELIMITED_3 = b"\x1a"  # field 3, wire type 2


_ONE_BYTE_VARINTS = [bytes((i,)) for i in range(0x80)]


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _ONE_BYTE_VARINTS[value]
    if value < 0:
        value += 1 << 64  # int64 two's complement, as protobuf encodes negative int64
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


@functools.cache
def _key_field(key: str) -> bytes:
    encoded = key.encode()
    return _LENGTH_DELIMITED_1 + _varint(len(encoded)) + encoded


def _entry(key: str, value: bytes | int) -> tuple[bytes, bytes]:
    """One entry of the Features map as (header, payload): header + payload is the entry.

    A bytes value is the payload itself, never copied here: for an image, the entry's framing is computed
    from lengths and only the few header bytes are built.
    """
    if isinstance(value, bytes):
        payload = value
        values = _LENGTH_DELIMITED_1 + _varint(len(value))  # BytesList{1: value}
        kind = _LENGTH_DELIMITED_1 + _varint(len(values) + len(value))  # Feature{1: bytes_list}
    elif isinstance(value, int):
        payload = b""
        packed = _varint(value)
        values = _LENGTH_DELIMITED_1 + _varint(len(packed)) + packed  # Int64List{1: packed}
        kind = _LENGTH_DELIMITED_3 + _varint(len(values))  # Feature{3: int64_list}
    else:
        raise TypeError(f"feature values must be bytes or int, got {type(value).__name__}")
    feature_size = len(kind) + len(values) + len(payload)
    body = (
        _key_field(key) + _LENGTH_DELIMITED_2 + _varint(feature_size) + kind + values
    )  # entry{1: key, 2: ...}
    return _LENGTH_DELIMITED_1 + _varint(len(body) + len(payload)) + body, payload


# Entries of a short value (an int, a label, a format name, a file name) are remembered: most of an image's
# features are the same for a whole work unit or take few values (format, colorspace, channels, synset,
# label, common heights and widths), so each is built once (docs/performance.md, 'Sharding').
_SHORT_VALUE_BYTES = 64


@functools.lru_cache(maxsize=4096)
def _short_entry(key: str, value: bytes | int) -> bytes:
    header, payload = _entry(key, value)
    return header + payload


def encode_example(features: dict[str, bytes | int]) -> bytes:
    """A serialized tf.train.Example with one value per feature (bytes -> BytesList, int -> Int64List)."""
    return b"".join(example_pieces(features))


def example_pieces(features: dict[str, bytes | int]) -> list[bytes]:
    """``encode_example(features)`` as pieces whose concatenation is the Example, long values uncopied.

    Each long value (an image) is a piece of its own, the very object given, and the framing around it is
    joined into the pieces between: a writer that writes the pieces one after the other never copies the image
    into an Example first.
    """
    parts = []
    for key in sorted(features):
        value = features[key]
        if isinstance(value, int) or (isinstance(value, bytes) and len(value) <= _SHORT_VALUE_BYTES):
            parts.append(_short_entry(key, value))
        else:
            parts += _entry(key, value)
    pieces = []
    framing = [_LENGTH_DELIMITED_1, _varint(sum(map(len, parts)))]  # Example{1: Features{1: entries}}
    for part in parts:
        if len(part) > _SHORT_VALUE_BYTES:
            pieces += (b"".join(framing), part)
            framing = []
        else:
            framing.append(part)
    pieces.append(b"".join(framing))
    return pieces


def short_entries(features: dict[str, bytes | int]) -> bytes:
    """The serialized map entries of ``features`` (ints and short bytes values) in key order: a run of entries
    to splice into an Example with ``spliced_example_pieces``."""
    return b"".join(_short_entry(key, features[key]) for key in sorted(features))


def spliced_example_pieces(before: bytes, key: str, value: bytes, after: bytes) -> list[bytes]:
    """``example_pieces`` of the Example whose entries, in key order, are ``before`` (``short_entries`` of
    the keys sorting before ``key``), ``key: value``, then ``after`` (those sorting after it); ``value`` is a
    piece of its own, uncopied. The same bytes as ``example_pieces`` of the whole map, with a few joins
    instead of a sort and a lookup per feature: an image's Example is built per unit from what its images
    share."""
    header, payload = _entry(key, value)
    size = len(before) + len(header) + len(payload) + len(after)
    return [_LENGTH_DELIMITED_1 + _varint(size) + before + header, payload, after]


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes):
    """(field number, wire type, value) of a protobuf message: varints as int, length-delimited as bytes."""
    pos = 0
    while pos < len(data):
        tag, pos = _read_varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, pos = _read_varint(data, pos)
        elif wire_type == 2:
            length, pos = _read_varint(data, pos)
            value, pos = data[pos : pos + length], pos + length
            if len(value) != length:
                raise ValueError("truncated field")
        elif wire_type == 5:
            value, pos = data[pos : pos + 4], pos + 4
        elif wire_type == 1:
            value, pos = data[pos : pos + 8], pos + 8
        else:
            raise ValueError(f"unsupported wire type {wire_type}")
        yield number, wire_type, value


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _feature_values(feature: bytes) -> list:
    for kind, _, payload in _fields(feature):
        if kind == 1:  # BytesList
            return [value for number, _, value in _fields(payload) if number == 1]
        if kind == 3:  # Int64List, packed (wire type 2) or not (wire type 0)
            values = []
            for number, wire_type, value in _fields(payload):
                if number != 1:
                    continue
                if wire_type == 0:
                    values.append(_int64(value))
                else:
                    pos = 0
                    while pos < len(value):
                        item, pos = _read_varint(value, pos)
                        values.append(_int64(item))
            return values
        if kind == 2:  # FloatList
            packed = b"".join(value for number, _, value in _fields(payload) if number == 1)  # packed or not
            return list(struct.unpack(f"<{len(packed) // 4}f", packed))
    return []


def decode_example(data: bytes) -> dict[str, list]:
    """The features of a serialized tf.train.Example: key -> list of bytes, ints or floats.

    Raises:
      ValueError: the bytes are not a well-formed Example.
    """
    features = {}
    for number, _, payload in _fields(data):
        if number != 1:
            continue
        for entry_number, _, entry in _fields(payload):
            if entry_number != 1:
                continue
            key, value = None, b""
            for field, _, item in _fields(entry):
                if field == 1:
                    key = item.decode("utf-8")
                elif field == 2:
                    value = item
            if key is not None:
                features[key] = _feature_values(value)
    return features


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _masked_crc(data: bytes) -> bytes:
    return struct.pack("<I", _mask(google_crc32c.value(data)))


def masked_crc_value(pieces: list[bytes]) -> int:
    """The masked CRC32C TFRecord stores for the record whose data is the concatenation of ``pieces``."""
    crc = 0
    for piece in pieces:
        crc = google_crc32c.extend(crc, piece)
    return _mask(crc)


def frame_record(data: bytes) -> bytes:
    """One TFRecord: the framing TensorFlow's TFRecordWriter writes around ``data``."""
    header, footer = _framing(data)
    return header + data + footer


def write_record(f, data: bytes) -> int:
    """Writes one TFRecord of ``data`` to ``f`` without copying ``data``; returns the bytes written."""
    header, footer = _framing(data)
    f.write(header)
    f.write(data)
    f.write(footer)
    return len(header) + len(data) + len(footer)


def write_record_pieces(f, pieces: list[bytes], masked_crc: int) -> int:
    """Writes one TFRecord whose data is the concatenation of ``pieces`` and whose masked data CRC is
    ``masked_crc`` (see ``masked_crc_value``), copying nothing; returns the bytes written."""
    data_len = sum(map(len, pieces))
    length = struct.pack("<Q", data_len)
    f.write(length + _masked_crc(length))
    for piece in pieces:
        f.write(piece)
    f.write(struct.pack("<I", masked_crc))
    return 12 + data_len + 4  # length and its CRC, data, data CRC


def _framing(data: bytes) -> tuple[bytes, bytes]:
    length = struct.pack("<Q", len(data))
    return length + _masked_crc(length), _masked_crc(data)


def read_records(f):
    """The records of an uncompressed TFRecord file object, checking both CRCs."""
    while True:
        header = f.read(12)
        if not header:
            return
        if len(header) != 12 or _masked_crc(header[:8]) != header[8:]:
            raise OSError("corrupt TFRecord length header")
        (length,) = struct.unpack("<Q", header[:8])
        data = f.read(length)
        footer = f.read(4)
        if len(data) != length or _masked_crc(data) != footer:
            raise OSError("corrupt TFRecord data")
        yield data
