"""Readers for the on-disk formats: LIBSVM/svmlight text, idx (MNIST), CIFAR-10 pickles and PNGs."""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import math
import os
import pickle
import stat
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from stlsgd.data.dataset import Dataset
from stlsgd.errors import DataError

CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

# Errors a damaged compressed stream raises; each becomes one DataError line.
_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)


def _not_found(path: Path) -> DataError:
    return DataError(f"{path}: not found")


def _corrupt(path: Path, err: BaseException) -> DataError:
    kind = "bz2" if path.suffix == ".bz2" else "gzip"
    return DataError(f"{path}: corrupt or truncated {kind} file ({type(err).__name__}: {err})")


def _unreadable(path: Path, err: BaseException) -> DataError:
    """A damaged compressed stream, or a file-system failure (an OSError with an errno, e.g. no permission)."""
    if isinstance(err, OSError) and err.errno is not None:
        return DataError(f"{path}: cannot read ({err.strerror or err})")
    return _corrupt(path, err)  # gzip/zlib errors, and bz2's errno-less OSError("Invalid data stream")


def _first_line(err: BaseException) -> str:
    """An exception's message cut to its first line (third-party messages can span several)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _clip(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _open_binary(path: Path) -> io.BufferedIOBase:
    # Same suffix rule and binary mode as sklearn's load_svmlight_file, so the scanner reads what sklearn read.
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    if path.suffix == ".bz2":
        return bz2.open(path, "rb")
    return open(path, "rb")


#: A compressed data file may inflate to at most MAX_RATIO times its own size once past MIN_INFLATED bytes. Real
#: svmlight and idx files inflate 3-15 times (a9a: 12); deflate's ceiling is about 1032, which is what a
#: decompression bomb uses to fill the memory long after loading began.
MAX_RATIO = 200
MIN_INFLATED = 64 * 2**20


def _bomb(path: Path, what: str) -> DataError:
    return DataError(
        f"{path}: inflates to {what} (a decompression bomb, or not the data file?); "
        "replace it (stlsgd data fetch NAME for a registered dataset)"
    )


def _inflation_cap(compressed_bytes: int) -> int:
    return max(MIN_INFLATED, MAX_RATIO * compressed_bytes)


def _check_inflated(path: Path, max_lines: int | None) -> None:
    """Refuse a .gz/.bz2 file that inflates to more than :func:`_inflation_cap` of its size, or to more than
    ``max_lines`` lines (a registered dataset's declared rows), streaming: memory stays bounded."""
    if path.suffix not in (".gz", ".bz2"):
        return
    compressed = os.stat(path).st_size
    cap = _inflation_cap(compressed)
    total = lines = 0
    try:
        with _open_binary(path) as fh:
            while chunk := fh.read(1 << 20):
                total += len(chunk)
                lines += chunk.count(b"\n")
                if max_lines is not None and lines > max_lines:
                    raise _bomb(path, f"more than the {max_lines:,} lines this dataset declares")
                if total > cap:
                    raise _bomb(path, f"more than {_nbytes(cap)}, over {MAX_RATIO} times its {_nbytes(compressed)}")
    except (*_GZIP_ERRORS, OSError) as err:
        raise _unreadable(path, err) from None


def _require_file(path: Path, what: str) -> None:
    """Refuse, in one line, a path that is missing, a directory, a device/FIFO (which could block) or unstatable."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: an embedded NUL byte
        raise _not_found(path) from None
    except OSError as err:  # permission denied on a parent, name too long, ...
        raise DataError(f"{path}: cannot read ({err.strerror or err})") from None
    if stat.S_ISDIR(mode):
        raise DataError(f"{path}: is a directory, not {what}")
    if not stat.S_ISREG(mode):
        raise DataError(f"{path}: is a special file (device, FIFO or socket), not {what}")


def _read_bytes(path: Path) -> bytes:
    """Whole file, gunzipped when it starts with the gzip magic (suffixes lie more often than magics)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise _not_found(path) from None
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror or err})") from None
    if raw[:2] == b"\x1f\x8b":
        cap = _inflation_cap(len(raw))
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as fh:
                data = fh.read(cap + 1)  # bounded: a decompression bomb stops at the cap
        except _GZIP_ERRORS as err:
            raise _corrupt(path, err) from None
        if len(data) > cap:
            raise _bomb(path, f"more than {_nbytes(cap)}, over {MAX_RATIO} times its {_nbytes(len(raw))}")
        return data
    return raw


# --------------------------------------------------------------------------- svmlight

#: Largest feature index (= number of features d) accepted from an svmlight file that does not declare its size.
#: Logistic regression keeps a dense float64 model of d weights for every client (a num_clients x d array), so
#: d = 2^24 already costs 128 MiB per client; a file naming feature 10^8 (763 MiB per client) or 2*10^9 (14.9 GiB)
#: is almost surely a mistake that would otherwise end in a MemoryError long after loading, and 10^12 in sklearn's
#: OverflowError. A registered dataset declares its n_features, which then replaces this limit.
MAX_FEATURES = 2**24
#: Hard limit of any declared n_features: sklearn's svmlight parser holds an index in a 32-bit C int.
INDEX_LIMIT = 2**31 - 1
_SHOW = 40  # longest token quoted in a message


def _show(token: bytes) -> str:
    """A token for a message: quoted, non-printable and non-UTF-8 bytes escaped, long ones shortened."""
    short = token[:_SHOW] + (b"..." if len(token) > _SHOW else b"")
    try:
        return repr(short.decode("utf-8"))
    except UnicodeDecodeError:
        return repr(short)[1:]  # b'\xff' -> '\xff'


def _nbytes(n: int) -> str:
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024 or unit == "EiB":
            break
        value /= 1024
    return f"{value:.3g} {unit}"


def _too_large(key: bytes, idx: int | None) -> str:
    limit = f"limit {MAX_FEATURES} = 2^24"
    if idx is None:  # more digits than int() converts
        return f"feature index {_show(key)[1:-1]} ({len(key)} digits) is too large ({limit})"
    return (
        f"feature index {idx} is too large ({limit}: d = {idx} features would need "
        f"{_nbytes(8 * idx)} of float64 model weights per client)"
    )


def _lowest_index(n_features: int | None) -> int:
    """A registered dataset's file (``n_features`` declared) is a published LIBSVM file, 1-based: an index 0 there
    is damage, not a convention. Your own file may be 0-based, as scikit-learn's ``dump_svmlight_file`` writes."""
    return 0 if n_features is None else 1


def _scan_svmlight(path: Path, n_features: int | None) -> Iterator[tuple[int, str]]:
    """Yield (line number, problem) for each bad line; only run after sklearn's fast reader failed or read nonsense.

    Mirrors sklearn's parser: binary lines, a comment starts at the first ``#`` before any NUL byte, tokens split on
    ASCII whitespace, an optional ``qid:`` first feature, ``int``/``float`` on the raw bytes.
    """
    limit = MAX_FEATURES if n_features is None else n_features
    low = _lowest_index(n_features)
    with _open_binary(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            nul = line.find(b"\0")
            cut = line.find(b"#", 0, nul if nul >= 0 else len(line))
            body = (line[:cut] if cut >= 0 else line).split()
            if not body:
                continue
            try:
                label = float(body[0])
            except ValueError:
                yield lineno, f"malformed svmlight line: bad label {_show(body[0])}"
                continue
            if not math.isfinite(label):
                yield lineno, f"malformed svmlight line: non-finite label {_show(body[0])}"
                continue
            features = body[1:]
            if features and features[0].startswith(b"qid"):
                if b":" not in features[0]:
                    yield lineno, f"malformed svmlight line: token {_show(features[0])} is not index:value"
                    continue
                features = features[1:]
            last = -1
            for tok in features:
                key, sep, val = tok.partition(b":")
                if not sep:
                    yield lineno, f"malformed svmlight line: token {_show(tok)} is not index:value"
                    break
                try:
                    idx = int(key)
                except ValueError:
                    if key.isdigit():  # only digits, but more than Python converts
                        yield lineno, _too_large(key, None)
                    else:
                        yield lineno, f"malformed svmlight line: token {_show(tok)} is not index:value"
                    break
                if idx < low:
                    problem = f"negative feature index {idx}" if low == 0 else f"feature index {idx} < 1"
                    yield lineno, f"malformed svmlight line: {problem}"
                    break
                if idx > limit:
                    if n_features is not None:
                        yield lineno, f"feature index {idx} exceeds n_features={n_features}"
                    else:
                        yield lineno, _too_large(key, idx)
                    break
                if idx <= last:
                    yield lineno, f"malformed svmlight line: feature indices not increasing ({last} then {idx})"
                    break
                try:
                    value = float(val)
                except ValueError:
                    yield lineno, f"malformed svmlight line: token {_show(tok)} is not index:value"
                    break
                if not math.isfinite(value):
                    yield lineno, f"malformed svmlight line: non-finite value in {_show(tok)}"
                    break
                last = idx


def _first_problem(path: Path, n_features: int | None, fallback: str) -> DataError:
    """The first bad line of ``path`` as a DataError, or ``FILE: fallback`` when the scanner finds none."""
    try:
        for lineno, problem in _scan_svmlight(path, n_features):
            return DataError(f"{path}:{lineno}: {problem}")
    except (*_GZIP_ERRORS, OSError) as err:
        return _unreadable(path, err)
    return DataError(f"{path}: {fallback}")


def read_svmlight(
    path: str | Path, n_features: int | None = None, *, name: str | None = None, max_lines: int | None = None
) -> Dataset:
    """Read a two-class LIBSVM/svmlight file (plain, .gz or .bz2); labels become -1/+1 (larger -> +1).

    Indices start at 1 (LIBSVM's convention). Without ``n_features`` (your own file), a file where some line holds
    index 0 is read as 0-based, as scikit-learn's ``dump_svmlight_file`` writes by default (and
    ``load_svmlight_file`` reads by default); a registered dataset's file must be 1-based (:func:`_lowest_index`).

    Without ``n_features`` the file may use feature indices up to :data:`MAX_FEATURES` (2^24; see there why);
    with it, indices up to ``n_features`` (at most :data:`INDEX_LIMIT`). A compressed file is first inflated
    as a stream and refused when it holds more than ``max_lines`` lines (a registered dataset's declared rows)
    or inflates more than :data:`MAX_RATIO` times (a decompression bomb). Every problem is a one-line DataError
    naming the file and, where it lies on one line, the line number.
    """
    from sklearn.datasets import load_svmlight_file

    path = Path(path)
    if n_features is not None and not 1 <= n_features <= INDEX_LIMIT:
        raise DataError(f"{path}: n_features={n_features} outside 1..{INDEX_LIMIT}")
    _require_file(path, "an svmlight file")
    _check_inflated(path, max_lines)
    try:
        # "auto": an index 0 can only mean a 0-based file; without one, 1-based is the only reading LIBSVM allows.
        zero_based = "auto" if _lowest_index(n_features) == 0 else False
        X, y = load_svmlight_file(str(path), n_features=n_features, dtype=np.float64, zero_based=zero_based)
    except (*_GZIP_ERRORS, OSError) as err:
        raise _unreadable(path, err) from None
    except (ValueError, OverflowError) as err:  # OverflowError: an index beyond sklearn's C int
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise _first_problem(path, n_features, f"malformed svmlight file ({msg})") from None
    if n_features is None and X.shape[1] > MAX_FEATURES:
        raise _first_problem(path, n_features, f"{X.shape[1]} features exceed the limit {MAX_FEATURES} = 2^24")
    if not (np.isfinite(y).all() and np.isfinite(X.data).all()):
        # sklearn parses "nan"/"inf" (and 1e400) as numbers; a model trained on them only diverges, so name the line.
        raise _first_problem(path, n_features, "malformed svmlight file (non-finite label or value)")
    if y.size == 0:
        raise DataError(f"{path}: no data: the file holds no svmlight lines")
    if X.nnz == 0:  # sklearn keeps explicit zeros, so nnz == 0 means not one index:value token
        raise DataError(f"{path}: no features: every line holds only a label")
    labels = np.unique(y)
    if labels.size != 2:
        shown = ", ".join(f"{v:g}" for v in labels[:10]) + (", ..." if labels.size > 10 else "")
        raise DataError(f"{path}: expected 2 label values, found {labels.size} ({shown})")
    y_pm = np.where(y == labels[1], 1.0, -1.0)
    X = sp.csr_matrix(X, dtype=np.float64)
    X.sort_indices()
    return Dataset(name=name or path.name.removesuffix(".gz"), X=X, y=y_pm, num_classes=2)


# --------------------------------------------------------------------------- idx (MNIST)

_IDX_DTYPES: dict[int, str] = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """Read an idx file (plain or gzip) into a native-endian array of its declared shape."""
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES or data[3] == 0:
        raise DataError(f"{path}: not an idx file (bad magic {data[:4].hex() or 'empty'})")
    dtype = np.dtype(_IDX_DTYPES[data[2]])
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: truncated idx header ({len(data)} of {header} bytes)")
    dims = tuple(int(v) for v in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = math.prod(dims) * dtype.itemsize  # Python ints: absurd dims cannot wrap around
    actual = len(data) - header
    if actual != expected:
        raise DataError(f"{path}: idx payload is {actual} bytes, expected {expected} for shape {dims} of {dtype.name}")
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="))  # copy: writable and native byte order


def _mnist_pair(images_path: str | Path, labels_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8 or 0 in images.shape[1:]:
        raise DataError(f"{images_path}: expected uint8 images of shape (n, H, W), got {images.dtype} {images.shape}")
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DataError(f"{labels_path}: expected a 1-d file of integer labels, got {labels.dtype} {labels.shape}")
    if labels.shape[0] != images.shape[0]:
        raise DataError(f"{labels_path}: {labels.shape[0]} labels but {images_path} has {images.shape[0]} images")
    return images, labels


def mnist_binary(images_path: str | Path, labels_path: str | Path, pos: int = 4, neg: int = 9) -> Dataset:
    """The paper's MNIST subset: digits ``pos`` (+1) and ``neg`` (-1), pixels/255, CSR, original row order."""
    images, labels = _mnist_pair(images_path, labels_path)
    n_pos, n_neg = int((labels == pos).sum()), int((labels == neg).sum())
    if n_pos == 0 or n_neg == 0:
        raise DataError(f"{labels_path}: expected images of both digits {pos} and {neg}, found {n_pos} and {n_neg}")
    keep = np.flatnonzero((labels == pos) | (labels == neg))
    X = sp.csr_matrix(images[keep].reshape(keep.size, images.shape[1] * images.shape[2]).astype(np.float64) / 255.0)
    y = np.where(labels[keep] == pos, 1.0, -1.0)
    return Dataset(name=f"mnist{pos}{neg}", X=X, y=y, num_classes=2)


def mnist10(images_path: str | Path, labels_path: str | Path) -> Dataset:
    """All ten MNIST digits as float32 (n, 1, 28, 28) in [0, 1]; int64 labels."""
    images, labels = _mnist_pair(images_path, labels_path)
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{labels_path}: labels outside 0..9 (min {labels.min()}, max {labels.max()})")
    X = (images.astype(np.float32) / np.float32(255.0))[:, None, :, :]
    return Dataset(name="mnist10", X=X, y=labels.astype(np.int64), num_classes=10)


def digits_binary(pos: int = 4, neg: int = 9) -> Dataset:
    """scikit-learn's bundled 8x8 digits, rows of ``pos`` (+1) and ``neg`` (-1), pixels/16, CSR."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    data, target = np.asarray(bunch.data), np.asarray(bunch.target)
    keep = np.flatnonzero((target == pos) | (target == neg))
    X = sp.csr_matrix(data[keep].astype(np.float64) / 16.0)
    y = np.where(target[keep] == pos, 1.0, -1.0)
    return Dataset(name=f"digits{pos}{neg}", X=X, y=y, num_classes=2)


# --------------------------------------------------------------------------- CIFAR-10

CIFAR10_TRAIN_BATCHES: tuple[str, ...] = tuple(f"data_batch_{i}" for i in range(1, 6))


class _NumpyOnlyUnpickler(pickle.Unpickler):
    # The batches hold only dicts, lists, bytes and numpy arrays; refusing every other global keeps a
    # tampered pickle from running code.
    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),  # how Python 3 pickles bytes at protocol 2
    }

    def find_class(self, module: str, name: str) -> type:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing global {module}.{name}")


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as fh:
            obj = _NumpyOnlyUnpickler(fh, encoding="bytes").load()
    except (FileNotFoundError, NotADirectoryError):
        raise _not_found(path) from None
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror or err})") from None
    except Exception as err:  # noqa: BLE001 - any failure of the restricted unpickler means a damaged batch
        raise DataError(f"{path}: not a CIFAR-10 pickle batch ({type(err).__name__}: {_first_line(err)})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: not a CIFAR-10 pickle batch (top level is {type(obj).__name__})")
    data = obj.get(b"data", obj.get("data"))
    labels = obj.get(b"labels", obj.get("labels"))
    if data is None or labels is None:
        raise DataError(f"{path}: CIFAR-10 batch lacks 'data' or 'labels'")
    try:
        data = np.asarray(data)
        labels = np.asarray(labels, dtype=np.int64)
    except (ValueError, TypeError, OverflowError) as err:
        raise DataError(f"{path}: not a CIFAR-10 pickle batch (labels or data: {_first_line(err)})") from None
    if data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8:
        raise DataError(f"{path}: expected uint8 data of shape (n, 3072), got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],):
        raise DataError(f"{path}: {labels.size} labels for {data.shape[0]} rows")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise DataError(f"{path}: labels outside 0..9")
    return data, labels


def cifar10_pickle(directory: str | Path, batches: tuple[str, ...] = CIFAR10_TRAIN_BATCHES) -> Dataset:
    """CIFAR-10 from the python pickle batches: float32 (n, 3, 32, 32)/255 and int64 labels.

    ``directory`` is ``cifar-10-batches-py`` itself or its parent; pass ``batches=("test_batch",)``
    for the test set.
    """
    directory = Path(directory)
    if (directory / "cifar-10-batches-py").is_dir():
        directory = directory / "cifar-10-batches-py"
    parts = [_read_cifar_batch(directory / b) for b in batches]
    data = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, 3072), np.uint8)
    labels = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, np.int64)
    # Rows are R, G, B planes of 32x32 in row-major order, i.e. already (3, 32, 32).
    X = data.reshape(-1, 3, 32, 32).astype(np.float32) / np.float32(255.0)
    return Dataset(name="cifar10", X=X, y=labels, num_classes=10)


def cifar10_png(folder: str | Path, labels_csv: str | Path, *, name: str = "cifar10-png") -> Dataset:
    """CIFAR-10 images from a folder of 32x32 RGB PNGs listed in a ``filename,label`` CSV (Kaggle layout).

    Labels are class names (airplane..truck -> 0..9) or integers 0..9; rows follow the CSV order.
    """
    from PIL import Image, UnidentifiedImageError

    folder, labels_csv = Path(folder), Path(labels_csv)
    class_ids = {c: i for i, c in enumerate(CIFAR10_CLASSES)}
    try:
        text = labels_csv.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _not_found(labels_csv) from None
    except OSError as err:
        raise DataError(f"{labels_csv}: cannot read ({err.strerror or err})") from None
    except UnicodeDecodeError as err:
        raise DataError(f"{labels_csv}: not a UTF-8 text file ({err.reason} at byte {err.start})") from None
    images: list[np.ndarray] = []
    labels: list[int] = []
    rows = csv.reader(io.StringIO(text))
    while True:
        try:
            row = next(rows)
        except StopIteration:
            break
        except csv.Error as err:  # e.g. a field over the csv module's size limit
            raise DataError(f"{labels_csv}:{rows.line_num}: malformed CSV ({err})") from None
        lineno = rows.line_num
        if not row or all(not f.strip() for f in row):
            continue
        if len(row) != 2:
            raise DataError(f"{labels_csv}:{lineno}: expected 'filename,label', got {len(row)} fields")
        fname, label = row[0].strip(), row[1].strip()
        if lineno == 1 and label.lower() == "label":
            continue  # Kaggle's original file has an "id,label" header
        if label.lower() in class_ids:
            cls = class_ids[label.lower()]
        elif label.isascii() and label.isdigit() and int(label) < 10:  # not '²': str.isdigit takes any digit
            cls = int(label)
        else:
            raise DataError(f"{labels_csv}:{lineno}: unknown CIFAR-10 class {_clip(label)!r}")
        img_path = folder / (fname if Path(fname).suffix else f"{fname}.png")
        where = f"(listed at {labels_csv}:{lineno})"
        if not fname or "\0" in fname:
            raise DataError(f"{labels_csv}:{lineno}: bad image file name {_clip(fname)!r}")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # refused below unless 32x32
                img = Image.open(img_path)
            with img:
                if img.mode != "RGB" or img.size != (32, 32):
                    raise DataError(
                        f"{img_path}: expected a 32x32 RGB image, got {img.mode} {img.size[0]}x{img.size[1]} {where}"
                    )
                images.append(np.asarray(img, dtype=np.uint8).transpose(2, 0, 1))
        except DataError:
            raise
        except (FileNotFoundError, NotADirectoryError):
            raise DataError(f"{img_path}: not found {where}") from None
        except IsADirectoryError:
            raise DataError(f"{img_path}: is a directory, not an image {where}") from None
        except UnidentifiedImageError:
            raise DataError(f"{img_path}: not an image file {where}") from None
        except OSError as err:
            detail = err.strerror if err.errno is not None else _first_line(err)
            raise DataError(f"{img_path}: unreadable image ({detail}) {where}") from None
        except Exception as err:  # noqa: BLE001 - the PNG decoder fails in many ways on damaged files
            raise DataError(
                f"{img_path}: unreadable image ({type(err).__name__}: {_first_line(err)}) {where}"
            ) from None
        labels.append(cls)
    if not images:
        raise DataError(f"{labels_csv}: lists no images")
    X = np.stack(images).astype(np.float32) / np.float32(255.0)
    return Dataset(name=name, X=X, y=np.asarray(labels, dtype=np.int64), num_classes=10)


def normalize_channels(
    X: np.ndarray, mean: np.ndarray | None = None, std: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-channel standardisation of (n, C, H, W) images; returns (X_normalized, mean, std).

    Pass the training set's ``mean``/``std`` to normalise a test set with the same constants.
    """
    if X.ndim != 4:
        raise ValueError(f"expected images of shape (n, C, H, W), got {X.shape}")
    if mean is None:
        mean = X.mean(axis=(0, 2, 3), dtype=np.float64).astype(np.float32)
    if std is None:
        std = X.std(axis=(0, 2, 3), dtype=np.float64).astype(np.float32)
        std = np.where(std > 0, std, np.float32(1.0)).astype(np.float32)  # a constant channel stays finite
    mean = np.asarray(mean, dtype=np.float32)
    std = np.asarray(std, dtype=np.float32)
    Xn = (X.astype(np.float32) - mean[None, :, None, None]) / std[None, :, None, None]
    return Xn, mean, std
