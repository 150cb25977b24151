"""One tile setting for every matmul-shaped kernel of the course: :class:`TileConfig`.

A Triton matmul program is shaped by a handful of numbers: the ``BLOCK_M x BLOCK_N`` tile
of C it owns, how deep each step along K reads (``BLOCK_K``), the program order
(``GROUP_M`` rows of tiles per group), ``num_warps`` groups of 32 threads, ``num_stages``
buffers of the software pipeline, and, for lesson 07's kernel, ``SPLIT_K`` slices of the K
loop. A kernel may add switches of its own (the persistent kernel's ``FLATTEN`` and
``SPLIT_EPILOGUE``, the TMA rung's ``EPILOGUE_SPLIT``): they ride along as ``options``.

A :class:`TileConfig` holds them once, checked, and answers what every lesson asks of a
setting:

* what it costs on chip: :meth:`~TileConfig.shared_memory_bytes`, by the one formula of
  :func:`helpers.intensity.sram_bytes`, and :meth:`~TileConfig.accumulator_registers`;
* whether it fits a GPU of the table (:meth:`~TileConfig.fits`): the per-program limit is
  :attr:`helpers.hardware.GPUSpec.smem_per_program_bytes`;
* how Triton and the records spell it: :meth:`~TileConfig.triton_config`,
  :meth:`~TileConfig.from_triton`, and :meth:`~TileConfig.as_dict` /
  :meth:`~TileConfig.from_dict` with the keys the committed records and the tuned path's
  saved decisions hold (``BLOCK_M``, ..., ``num_warps``, ``num_stages``);
* how the lessons print it: :meth:`~TileConfig.describe` (``128x256x64 w8 s3``).

A TileConfig also reads like the dict a record holds (``config["BLOCK_M"]``,
``dict(config)``, ``{**config, "ms": ...}``), so that a table drawn from a record and one
drawn from the live settings are the same code; ``config.block_m`` is the same number.

The three blocks come first, by position; everything else is named, so that no reader has
to remember in which order a tuple listed warps and stages.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, replace

import torch
import triton

from ... import hardware, intensity, runtime

# fp32 accumulator registers a thread may spend: a thread has 255, and the loads, the
# addresses and the pipeline need the rest (lesson 04: a 256-register accumulator spills).
MAX_ACCUMULATOR_REGISTERS = 128
# The GPU of the course's napkin math and recorded runs, and of the tuners in CPU mode.
REFERENCE_GPU = "H100-SXM"

# Each field under the names a kernel's launch gives it (constexprs and launch options).
FIELDS = {"BLOCK_M": "block_m", "BLOCK_N": "block_n", "BLOCK_K": "block_k",
          "GROUP_M": "group_m", "SPLIT_K": "split_k", "num_warps": "num_warps",
          "num_stages": "num_stages"}
REQUIRED = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
# The constexprs of lesson 04's kernels (v3, v4) and of most others: the tile and the order.
TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")
WARPS = (1, 2, 4, 8, 16, 32)


def _whole(name: str, value, why: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} = {value!r}: it must be a whole number of at least 1 ({why})")


def _block(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 16 \
            or value & (value - 1):
        near = ""
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 16:
            low = 1 << (int(value).bit_length() - 1)
            near = f"; the nearest are {low} and {2 * low}"
        raise ValueError(f"{name} = {value!r}: a block must be a power of two of at least 16 "
                         f"(tl.arange needs a power of two, tl.dot at least 16){near}")


@dataclass(frozen=True)
class TileConfig(Mapping):
    """One setting of a tiled matmul kernel; see the module's docstring.

    ``TileConfig(128, 256, 64, num_warps=8, num_stages=3)``: a 128 x 256 tile of C, 64
    deep along K, 8 warps, 3 pipeline stages, ``GROUP_M = 8`` and no split of K.
    ``options`` (a dict, kept sorted as pairs so the setting stays hashable) carries a
    kernel's own switches, e.g. ``{"FLATTEN": True, "SPLIT_EPILOGUE": False}``.
    """

    block_m: int
    block_n: int
    block_k: int
    _: KW_ONLY
    num_warps: int
    num_stages: int
    group_m: int = 8
    split_k: int = 1
    options: tuple = ()

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            _block(name, getattr(self, name))
        if self.num_warps not in WARPS or isinstance(self.num_warps, bool):
            raise ValueError(f"num_warps = {self.num_warps!r}: a program has a power of two "
                             "from 1 to 32 warps (at most 1024 threads)")
        _whole("num_stages", self.num_stages, "1 is no pipelining; each stage more keeps one "
               "more A and B tile in flight")
        _whole("group_m", self.group_m, "rows of tiles per group of the program order; 1 is "
               "row-major order")
        _whole("split_k", self.split_k, "slices of the K loop; 1 is no split")
        given = self.options.items() if isinstance(self.options, Mapping) else self.options
        try:
            pairs = tuple(sorted((str(k), v) for k, v in given))
            hash(pairs)
        except (TypeError, ValueError):
            raise TypeError(f"options must be a dict of a kernel's switches (name -> bool, int "
                            f"or str), got {self.options!r}") from None
        clash = [k for k, _ in pairs if k in FIELDS or k in FIELDS.values()]
        if clash:
            raise ValueError(f"{clash[0]} is a field of TileConfig, not an option: pass it as "
                             f"{FIELDS.get(clash[0], clash[0])}=...")
        object.__setattr__(self, "options", pairs)

    # --- Reading it by the names kernels and records use. ------------------------------

    def option(self, name: str, default=None):
        """The kernel switch ``name`` (``"FLATTEN"``), or ``default`` if this setting has none."""
        return dict(self.options).get(name, default)

    def with_options(self, **options) -> TileConfig:
        """The same setting with these switches set (the others kept)."""
        return replace(self, options={**dict(self.options), **options})

    def __getitem__(self, key: str):
        """The value a launch gives ``key``: a field by its record name (``"BLOCK_M"``) or its
        own (``"block_m"``), else an option."""
        if key in FIELDS or key in FIELDS.values():
            return getattr(self, FIELDS.get(key, key))
        found = dict(self.options)
        if key in found:
            return found[key]
        raise KeyError(f"{key!r} is neither a field of TileConfig ({', '.join(FIELDS)}) nor "
                       f"one of this setting's options ({', '.join(found) or 'none'})")

    def record_keys(self) -> tuple[str, ...]:
        """The record keys of this setting: the fields, its options before the launch options."""
        return (*TILE_KEYS, "SPLIT_K", *(k for k, _ in self.options), "num_warps", "num_stages")

    def __iter__(self):
        return iter(self.record_keys())

    def __len__(self) -> int:
        return len(self.record_keys())

    def as_dict(self, keys=None) -> dict:
        """The setting as a record holds it: ``{"BLOCK_M": 128, ...}`` for ``keys`` (by
        default :meth:`keys`; a kernel passes its own, e.g. without ``SPLIT_K``)."""
        return {k: self[k] for k in (self.record_keys() if keys is None else keys)}

    @classmethod
    def from_dict(cls, config: Mapping, *, strict: bool = True) -> TileConfig:
        """A setting from a record's dict (``BLOCK_M``, ..., ``num_warps``, ``num_stages``, any
        upper-case key a kernel switch). Missing ``GROUP_M`` is 8, missing ``SPLIT_K`` 1.
        ``strict=False`` skips other lower-case keys (a record row's ``ms``, ``tflops``)."""
        if not isinstance(config, Mapping):
            raise TypeError(f"from_dict takes a dict of BLOCK_M, ..., num_warps, num_stages; "
                            f"got a {type(config).__name__}")
        fields, options = {}, {}
        for key, value in config.items():
            if key in FIELDS or key in FIELDS.values():
                fields[FIELDS.get(key, key)] = value
            elif isinstance(key, str) and key.isupper():
                options[key] = value
            elif strict:
                raise ValueError(f"config has {key!r}, which is neither a field ("
                                 f"{', '.join(FIELDS)}) nor a kernel switch (upper case)")
        missing = [k for k in REQUIRED if FIELDS[k] not in fields]
        if missing:
            raise ValueError(f"config lacks {', '.join(missing)}: a tile setting needs "
                             f"{', '.join(REQUIRED)} (GROUP_M is 8 and SPLIT_K 1 unless given)")
        try:
            return cls(**fields, options=options)
        except ValueError as err:        # name the key as the dict spells it: BLOCK_M
            message = str(err)
            for key in config:
                field = FIELDS.get(key, key)
                if isinstance(key, str) and message.startswith(f"{field} = "):
                    raise ValueError(key + message[len(field):]) from None
            raise

    @classmethod
    def from_triton(cls, config: triton.Config) -> TileConfig:
        """The setting of a ``triton.Config`` (an autotuner's candidate or its choice)."""
        return cls.from_dict({**config.kwargs, "num_warps": config.num_warps,
                              "num_stages": config.num_stages})

    @classmethod
    def of(cls, setting) -> TileConfig:
        """``setting`` as a TileConfig: itself, a ``triton.Config`` or a record's dict."""
        if isinstance(setting, cls):
            return setting
        if isinstance(setting, triton.Config):
            return cls.from_triton(setting)
        if isinstance(setting, Mapping):
            return cls.from_dict(setting, strict=False)
        raise TypeError(f"a tile setting is a TileConfig (or a record's dict, or a "
                        f"triton.Config), got {type(setting).__name__} {setting!r:.80}: write "
                        "TileConfig(block_m, block_n, block_k, num_warps=..., num_stages=...)")

    def triton_config(self, keys=TILE_KEYS, pre_hook=None) -> triton.Config:
        """The ``triton.Config`` of this setting for a kernel whose constexprs are ``keys``
        (lesson 04's v3: the tile and ``GROUP_M``), plus every option."""
        return triton.Config({**{k: self[k] for k in keys}, **dict(self.options)},
                             num_warps=self.num_warps, num_stages=self.num_stages,
                             pre_hook=pre_hook)

    # --- What it costs on chip, and whether it fits. -----------------------------------

    def shared_memory_bytes(self, dtype=torch.float16, stages: int | None = None,
                            staged_c: float = 0) -> int:
        """Shared memory a program keeps: ``stages`` (by default ``num_stages``) A and B
        tiles of ``dtype``, plus ``staged_c`` of a C tile for a kernel that stores C through
        the TMA (:func:`helpers.intensity.sram_bytes`)."""
        return intensity.sram_bytes(self.block_m, self.block_n, self.block_k, dtype,
                                    self.num_stages if stages is None else stages, staged_c)

    def accumulator_registers(self) -> int:
        """fp32 registers a thread holds for its share of the ``BLOCK_M x BLOCK_N``
        accumulator: the tile over ``32 x num_warps`` threads (at least one each)."""
        values = intensity.accumulator_bytes(self.block_m, self.block_n) // 4
        return -(-values // (32 * self.num_warps))

    def fits(self, gpu=REFERENCE_GPU, dtype=torch.float16, *, staged_c: float = 0,
             max_registers: int = MAX_ACCUMULATOR_REGISTERS) -> tuple[bool, str]:
        """Whether this setting can run on ``gpu`` at all, and if not, why: ``(ok, reason)``.

        ``gpu`` is a row of :data:`helpers.hardware.GPUS` (or its key, or the name the driver
        reports), whose per-program shared memory the table gives; or a number of bytes, the
        driver's figure for a GPU the table does not know."""
        limit = shared_memory_limit(gpu)
        smem = self.shared_memory_bytes(dtype, staged_c=staged_c)
        if smem > limit:
            return False, f"needs {smem:,} bytes of shared memory, over the {limit:,} here"
        regs = self.accumulator_registers()
        if regs > max_registers:
            return False, (f"its accumulator needs {regs} registers a thread, over the "
                           f"{max_registers} budgeted")
        return True, "fits"

    def describe(self, spelled_out: bool = False) -> str:
        """``128x256x64 w8 s3`` (tile, warps, stages), with split-K and ``GROUP_M`` when they
        differ from 1 and 8, and the switches that are on (``flatten``, ``split epilogue``).
        ``spelled_out``: every knob by its name, for a reader who has not met the shorthand,
        ``128x256x64 (GROUP_M 8, 8 warps, 3 stages)``."""
        tile = f"{self.block_m}x{self.block_n}x{self.block_k}"
        split = self.split_k > 1
        switches = [name.lower().replace("_", " ") + ("" if value is True else f" {value}")
                    for name, value in self.options if value]
        if spelled_out:
            knobs = [f"GROUP_M {self.group_m}", f"{self.num_warps} warps",
                     f"{self.num_stages} stages"] + [f"split-K {self.split_k}"] * split
            return f"{tile} ({', '.join(knobs + switches)})"
        text = f"{tile} w{self.num_warps} s{self.num_stages}"
        text += f" split-K {self.split_k}" * split
        text += f" G{self.group_m}" * (self.group_m != 8)
        return " ".join([text, *switches])


def shared_memory_limit(gpu) -> int:
    """Bytes of shared memory one program may use on ``gpu``: see :meth:`TileConfig.fits`."""
    if isinstance(gpu, hardware.GPUSpec):
        return gpu.smem_per_program_bytes
    if isinstance(gpu, str):
        return hardware.lookup(gpu).smem_per_program_bytes
    if isinstance(gpu, int) and not isinstance(gpu, bool) and gpu > 0:
        return gpu
    raise TypeError(f"gpu is a row of helpers.hardware.GPUS, its key (e.g. 'H100-SXM') or a "
                    f"number of bytes; got {gpu!r}")


@functools.cache
def gpu_in_use() -> tuple[hardware.GPUSpec | int, int]:
    """What a tuner checks settings against here, and the SMs it fills: ``(gpu, sms)``.

    ``gpu`` is the table's row for a GPU it knows, or the driver's per-program limit in bytes
    for one it does not; in CPU mode the reference H100 of the recorded runs."""
    if not runtime.is_gpu():
        spec = hardware.GPUS[REFERENCE_GPU]
        return spec, spec.sm_count
    props = triton.runtime.driver.active.utils.get_device_properties(
        torch.cuda.current_device())
    return hardware.current_gpu() or props["max_shared_mem"], props["multiprocessor_count"]
