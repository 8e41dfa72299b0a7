"""What SRC names, opened as a stream of Hugging Face tensors.

Every input, whatever its format, is read through one interface: the model's
``config.json``, its side files (tokenizer, generation config) and each tensor by
its Hugging Face name and layout. Converting is then the same loop for every pair
of formats, and ``--verify`` compares any two inputs tensor by tensor.

Inputs: an rlctl run (``runs/NAME``, a run name in ``./runs``, ``gs://.../runs/NAME``;
its latest complete checkpoint unless ``--step``), an Orbax step folder of a run, a
trainer folder (``--to trainer``'s output), a Hugging Face folder (sharded with its
index, or loose files), a single ``.safetensors`` file with ``config.json`` beside
it, and a GGUF file.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlctl.core.checkpoints import hf, layout
from rlctl.core.checkpoints.hf import SIDECARS, SafetensorsReader, np_dtype
from rlctl.core.checkpoints.kept import Kept, of_model_folder, of_reader
from rlctl.core.checkpoints.places import GcsPlace, LocalPlace, Place, open_place
from rlctl.core.errors import ConfigError
from rlctl.core.store.base import step_number

TRAINER_MARKER = "rlctl-trainer.json"  # written last into a trainer folder
RUN_SPEC = "spec.yaml"
_EXPECTED = (
    "expected an rlctl run, an Orbax checkpoint, a trainer folder, a Hugging Face "
    "safetensors folder or file, or a .gguf file"
)


@dataclass
class Source:
    """A model to read: config.json, side files, and tensors by HF name and layout."""

    uri: str
    kind: str  # run | orbax | trainer | hf | gguf
    config: dict[str, Any]
    sidecars: Place  # where config.json and the tokenizer files are
    step: int | None = None
    skipped: list[str] = field(default_factory=list)  # tensors not part of the model
    holds: Any = None  # what must live as long as the source (a run's staging folder)
    # a multimodal checkpoint's tensors outside its text model, listed after the
    # model's and read as they are (kept.py); None for a text-only one
    kept: Kept | None = None

    def __post_init__(self) -> None:
        self.family = layout.family_of(self.config)
        self.rules = layout.rules(self.config)
        self.by_hf = {n: r for r in self.rules for n in r.hf}

    def names(self) -> list[str]:
        model = [n for r in self.rules for n in r.hf]
        return model + (self.kept.names if self.kept is not None else [])

    def is_kept(self, name: str) -> bool:
        return self.kept is not None and name in self.kept.index

    def shape_dtype(self, name: str) -> tuple[tuple[int, ...], str]:
        raise NotImplementedError

    def read(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def read_rule(self, rule: layout.Rule) -> np.ndarray:
        """One trainer tensor, made of its HF tensors."""
        return rule.to_trainer([self.read(n) for n in rule.hf])

    def sidecar_files(self) -> list[str]:
        return [f for f in SIDECARS if self.sidecars.exists(f)]


class HfSource(Source):
    def __init__(
        self,
        uri: str,
        place: Place,
        files: list[str] | None,
        config: dict[str, Any],
        sidecars: Place,
        kind: str = "hf",
    ) -> None:
        super().__init__(uri, kind, config, sidecars)
        self.reader = SafetensorsReader(place, files)
        want = layout.hf_shapes(config)
        have = self.reader.tensors
        missing = [n for n in want if n not in have]
        if missing:
            raise ConfigError(
                f"{uri}: tensor {missing[0]!r} is missing"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
                hint="copy or download the model again",
            )
        for n, shape in want.items():
            if have[n].shape != shape:
                raise ConfigError(
                    f"{uri}: tensor {n!r} is {list(have[n].shape)}, config.json says {list(shape)}",
                    hint="copy or download the model again",
                )
        self.kept = of_reader(self.reader, config, want)
        self.skipped = [] if self.kept is not None else sorted(set(have) - set(want))

    def shape_dtype(self, name: str) -> tuple[tuple[int, ...], str]:
        t = self.reader.tensors[name]
        return t.shape, t.dtype

    def read(self, name: str) -> np.ndarray:
        return self.reader.read(name)

    def read_rule(self, rule: layout.Rule) -> np.ndarray:
        if rule.kind != "t" or rule.t_shape is None:
            return super().read_rule(rule)
        # transposed band by band as it is read: the untransposed tensor never exists
        info = self.reader.tensors[rule.hf[0]]
        cols, rows = info.shape
        out = np.empty((rows, cols), np_dtype(info.dtype))
        for r0, band in self.reader.bands(rule.hf[0]):
            layout.transpose_into(out, band, r0)
        return out.reshape(rule.t_shape(info.shape))


class TrainerSource(Source):
    """An Orbax step folder (a run's, or a trainer folder's) in the trainer's layout."""

    def __init__(
        self,
        uri: str,
        kind: str,
        step_dir: Path,
        config: dict[str, Any],
        sidecars: Place,
        step: int | None = None,
    ) -> None:
        from rlctl.core.checkpoints.orbax import OrbaxReader

        super().__init__(uri, kind, config, sidecars, step)
        self.reader = OrbaxReader(step_dir)
        # a trainer folder's own kept.safetensors, or the run's model folder's
        self.kept = of_model_folder(sidecars, config, self.by_hf)
        keys = set(self.reader.keys)
        missing = [r.key for r in self.rules if r.key not in keys]
        if missing:
            raise ConfigError(
                f"{uri}: array {missing[0]!r} is missing from the checkpoint "
                f"(not a {self.family} model of this config.json?)"
            )
        self._cached: tuple[str, list[np.ndarray]] | None = None
        self._meta: dict[str, tuple[tuple[int, ...], str]] = {}
        self._hf_shapes = layout.hf_shapes(config)

    def _parts(self, rule: layout.Rule) -> list[np.ndarray]:
        # Gemma's stacked k/v: both HF tensors come from one array, read once
        if self._cached is None or self._cached[0] != rule.key:
            self._cached = None
            self._cached = (rule.key, rule.to_hf(self.reader.read(rule.key)))
        return self._cached[1]

    def shape_dtype(self, name: str) -> tuple[tuple[int, ...], str]:
        if self.kept is not None and self.is_kept(name):
            return self.kept.shape_dtype(name)
        if name not in self._meta:
            _, dtype = self.reader.shape_dtype(self.by_hf[name].key)
            self._meta[name] = (self._hf_shapes[name], dtype)
        return self._meta[name]

    def _read_transposed(self, rule: layout.Rule) -> np.ndarray:
        """HF's [C, R] from the trainer's [R, C] view, a few MB of rows at a time."""
        assert rule.t_view is not None
        arr = self.reader._array(rule.key)
        shape = tuple(int(x) for x in arr.shape)
        rows, cols = rule.t_view(shape)
        per_index = rows // shape[0]  # view rows per index of the first axis
        dtype = np.dtype(arr.dtype.numpy_dtype)
        out = np.empty((cols, rows), dtype)
        step = max(1, hf.BAND_BYTES // max(1, cols * dtype.itemsize * per_index))
        # TensorStore reads whole chunks: a band smaller than a chunk would read its
        # chunk again for every band (an Orbax save often makes the array one chunk)
        chunk = arr.chunk_layout.read_chunk.shape
        if chunk is not None and chunk[0]:
            step = max(int(chunk[0]), step // int(chunk[0]) * int(chunk[0]))
        for a in range(0, shape[0], step):
            try:
                part = arr[a : min(a + step, shape[0])].read().result()
            except ValueError as e:  # a cut or garbled chunk
                from rlctl.core.checkpoints.orbax import unreadable

                raise unreadable(self.reader.step, rule.key, e) from e
            band = np.asarray(part).reshape(-1, cols)
            layout.transpose_into(out, band, a * per_index)
        self.reader._open.pop(rule.key, None)
        return out

    def read(self, name: str) -> np.ndarray:
        if self.kept is not None and self.is_kept(name):
            return self.kept.read(name)
        rule = self.by_hf[name]
        if rule.kind == "t" and rule.t_view is not None:
            return self._read_transposed(rule)
        if rule.kind == "same":
            return self.reader.read(rule.key)
        out = self._parts(rule)[rule.hf.index(name)]
        if name == rule.hf[-1]:
            self._cached = None  # the rule's last part: release the array
        return out

    def read_rule(self, rule: layout.Rule) -> np.ndarray:
        return self.reader.read(rule.key)


class LoraSource(Source):
    """A LoRA run's checkpoint: its base model (the run's model source) with the
    adapters of the checkpoint merged in, ``W + (alpha / rank) * a @ b`` (lora.py),
    tensor by tensor; ``adapter`` reads the adapters alone (``--to peft``)."""

    def __init__(
        self, uri: str, step_dir: Path, base: Source, record: dict[str, Any], step: int | None
    ) -> None:
        from rlctl.core.checkpoints import lora
        from rlctl.core.checkpoints.orbax import OrbaxReader

        super().__init__(uri, "run", base.config, base.sidecars, step)
        self.base = base
        self.record = record
        self.skipped = base.skipped
        self.kept = base.kept
        self.adapters = OrbaxReader(step_dir)
        try:
            self.scale = float(record["alpha"]) / int(record["rank"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
            raise ConfigError(
                f"{uri}: checkpoint {step}'s {lora.LORA_FILE} is damaged ({type(e).__name__})",
                hint="pick another step with --step",
            ) from e
        keys = set(self.adapters.keys)
        self.adapted = {r.key: r for r in self.rules if lora.adapter_keys(r)[0] in keys}
        if not self.adapted:
            raise ConfigError(
                f"{uri}: checkpoint {step} holds no adapter of this {self.family} model",
                hint="pick another step with --step",
            )

    def shape_dtype(self, name: str) -> tuple[tuple[int, ...], str]:
        return self.base.shape_dtype(name)

    def adapter(self, rule: layout.Rule) -> tuple[np.ndarray, np.ndarray]:
        from rlctl.core.checkpoints import lora

        a_key, b_key = lora.adapter_keys(rule)
        return self.adapters.read(a_key), self.adapters.read(b_key)

    def read_rule(self, rule: layout.Rule) -> np.ndarray:
        from rlctl.core.checkpoints import lora

        w = self.base.read_rule(rule)
        if rule.key not in self.adapted:
            return w
        try:
            return lora.merged(rule, w, *self.adapter(rule), self.scale)
        except ValueError as e:
            raise ConfigError(f"{self.uri}: {e}", hint="the run's base model changed?") from e

    def read(self, name: str) -> np.ndarray:
        rule = self.by_hf.get(name)
        if rule is None or rule.key not in self.adapted:  # kept tensors too: the base's
            return self.base.read(name)
        return rule.to_hf(self.read_rule(rule))[rule.hf.index(name)]


def _lora_base(uri: str, model_source: str, record: dict[str, Any], client: Any) -> Source:
    """The base model of a LoRA checkpoint, with the weights it was trained on (by
    SHA-256): merging adapters into other weights would be silently wrong."""
    from rlctl.core.checkpoints.lora import base_sha256
    from rlctl.core.config.models import DEFAULT_MODEL

    source = model_source or DEFAULT_MODEL
    if source == DEFAULT_MODEL:
        from rlctl.core.checkpoints.gguf import default_model_dir

        folder = Path(default_model_dir())
    elif Path(source).expanduser().is_dir():
        folder = Path(source).expanduser()
    else:
        try:
            from huggingface_hub import snapshot_download

            folder = Path(snapshot_download(source, local_files_only=True))
        except Exception as e:
            raise ConfigError(
                f"{uri}: the LoRA run's base model {source!r} is not on this "
                "machine (its weights are needed to merge the adapters)",
                hint=f"download it once (huggingface-cli download {source}), "
                "then convert again; or --to peft for the adapters alone",
            ) from e
    want = (record.get("base") or {}).get("sha256")
    if want and base_sha256(folder) != want:
        raise ConfigError(
            f"{uri}: the base model {source!r} is not the one the adapters were "
            "trained on (its SHA-256 differs)",
            hint="put the original model back, or --to peft for the adapters alone",
        )
    return _open_source(str(folder), None, client, None)


def _config(place: Place, where: str) -> dict[str, Any]:
    if not place.exists("config.json"):
        raise ConfigError(f"{where}: no config.json", hint=_EXPECTED)
    try:
        config = json.loads(place.read_bytes("config.json"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ConfigError(
            f"{place.uri}/config.json: not valid JSON", hint="copy or download the model again"
        ) from e
    if not isinstance(config, dict):
        raise ConfigError(f"{place.uri}/config.json: not a JSON object")
    return config


def _run_model_dir(source: str) -> Place:
    """The folder of a run's source model (its config.json and tokenizer files)."""
    from rlctl.core.config.models import DEFAULT_MODEL

    if source == DEFAULT_MODEL:
        from rlctl.core.checkpoints.gguf import default_model_dir

        return LocalPlace(default_model_dir())
    p = Path(source).expanduser()
    if p.is_dir():
        return LocalPlace(p)
    if source.count("/") == 1 and not source.startswith((".", "/")):
        try:
            from huggingface_hub import snapshot_download

            return LocalPlace(
                snapshot_download(
                    source, local_files_only=True, allow_patterns=["*.json", "tokenizer*"]
                )
            )
        except Exception as e:
            raise ConfigError(
                f"the run's model {source!r} is not in the local Hugging Face cache",
                hint=f"download it once (huggingface-cli download {source}), then convert again",
            ) from e
    raise ConfigError(f"the run's model {source!r} is not available on this machine")


def _run(uri: str, root: str, name: str, step: int | None, client: Any) -> Source:
    import yaml

    from rlctl.core.checkpoints.orbax import is_step_folder
    from rlctl.core.store import open_store
    from rlctl.core.store.base import CHECKPOINTS, existing_run, set_aside_checkpoints
    from rlctl.core.store.manifest import verify

    store = open_store(root, client) if root.startswith("gs://") else open_store(root)
    run = existing_run(store, name)
    steps = sorted(run.checkpoint_steps())
    if not steps:
        aside = set_aside_checkpoints(run)
        if aside:  # never "train it": the run has trained, its checkpoints are damaged
            where = "" if root.startswith("gs://") else f" --runs-dir {os.path.abspath(root)}"
            raise ConfigError(
                f"run {name!r} has no intact checkpoint: set aside as damaged: "
                + ", ".join(f"{CHECKPOINTS}/{n}" for n in aside),
                hint=f"'rlctl resume {name}{where} --recover' reads them back and keeps "
                "the ones that are intact"
                if not root.startswith("gs://")
                else f"copy the run here and 'rlctl resume {name} --recover' it",
            )
        raise ConfigError(
            f"run {name!r} has no complete checkpoint yet",
            hint="train it for at least checkpoint.interval steps",
        )
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ConfigError(
            f"run {name!r} has no complete checkpoint {step}",
            hint=f"complete checkpoints: {', '.join(map(str, steps))}",
        )
    run.fetch_checkpoint(step)  # gs://: into the local staging folder
    step_dir = Path(run.path_for(f"{CHECKPOINTS}/{step}"))

    def another() -> str:
        """Where to go from a damaged checkpoint: the others that verify (on this
        machine, their sizes against their manifests, no byte read), never back to one
        that is damaged too (#53: --step 4 pointed at 5, and 5 at 4)."""
        rest = [s for s in steps if s != step]
        if not root.startswith("gs://"):
            rest = [
                s
                for s in rest
                if verify(Path(run.path_for(f"{CHECKPOINTS}/{s}"))) is None
                and is_step_folder(Path(run.path_for(f"{CHECKPOINTS}/{s}")))
            ]
        if rest:
            return f"convert another with --step N (its intact checkpoints: {_steps(rest)})"
        where = "" if root.startswith("gs://") else f" --runs-dir {os.path.abspath(root)}"
        return (
            f"none of its other checkpoints is intact either: 'rlctl resume {name}{where} "
            "--recover' reads back any whose only damage is its manifest"
        )

    why = verify(step_dir)  # as resume judges it: every file against its manifest
    if why is not None:
        raise ConfigError(f"{uri}: checkpoint {step} is damaged ({why})", hint=another())
    if not is_step_folder(step_dir):
        raise ConfigError(
            f"{uri}: checkpoint {step} has no Orbax metadata (damaged?)", hint=another()
        )
    try:
        spec = yaml.safe_load(run.read_text(RUN_SPEC)) or {}
        model_source = str(spec.get("model", {}).get("source") or "")
    except (yaml.YAMLError, AttributeError, RecursionError, UnicodeDecodeError) as e:
        raise ConfigError(f"{uri}/{RUN_SPEC}: unreadable") from e
    from rlctl.core.checkpoints.lora import LORA_FILE
    from rlctl.core.config.models import DEFAULT_MODEL

    if (step_dir / LORA_FILE).is_file():  # a LoRA run: adapters plus a base reference
        try:
            record = json.loads((step_dir / LORA_FILE).read_text())
        except (OSError, ValueError, UnicodeDecodeError) as e:
            raise ConfigError(
                f"{uri}: checkpoint {step}'s {LORA_FILE} is unreadable",
                hint="pick another step with --step",
            ) from e
        base = _lora_base(uri, model_source, record, client)
        lora = LoraSource(uri, step_dir, base, record, step)
        lora.holds = (run, base)
        return lora
    model_dir = _run_model_dir(model_source or DEFAULT_MODEL)
    source = TrainerSource(uri, "run", step_dir, _config(model_dir, model_dir.uri), model_dir, step)
    source.holds = run  # a gs:// run deletes its staging copy when it is collected
    return source


def open_source(
    src: str, step: int | None = None, client: Any = None, runs_dir: str | None = None
) -> Source:
    """SRC, recognised by what it holds (see the module docstring)."""
    source = _open_source(src, step, client, runs_dir)
    if step is not None and source.kind != "run":
        raise ConfigError(f"--step applies to a run; {src!r} is a {source.kind} checkpoint")
    return source


def _open_source(src: str, step: int | None, client: Any, runs_dir: str | None) -> Source:
    from rlctl.core.checkpoints.orbax import CHECKPOINT, is_step_folder

    if step is not None and step < 0:
        raise ConfigError("--step must be >= 0")
    if src.startswith("gs://"):
        return _open_gcs(src, step, client)
    p = Path(src).expanduser()
    if not p.exists():
        if "/" not in src and not src.startswith("."):
            root = runs_dir or os.environ.get("RLCTL_RUNS_DIR") or "runs"
            if root.startswith("gs://") or (Path(root) / src).is_dir():
                return _run(src, root, src, step, client)
        raise ConfigError(f"{src!r} does not exist", hint=_EXPECTED)
    if p.is_file():
        if p.suffix == ".gguf":
            return _gguf(p)
        if p.suffix == ".safetensors":
            place = LocalPlace(p.parent)
            return HfSource(str(p), place, [p.name], _config(place, str(p.parent)), place)
        raise ConfigError(f"{src!r} is not a checkpoint", hint=_EXPECTED)
    if (p / RUN_SPEC).is_file():
        return _run(src, str(p.parent), p.name, step, client)
    if (p / TRAINER_MARKER).is_file():
        place = LocalPlace(p)
        return TrainerSource(src, "trainer", p / CHECKPOINT, _config(place, src), place)
    if is_step_folder(p):  # <run>/checkpoints/<step>: the run's model tells the config
        run_dir = p.parent.parent
        step_name = step_number(p.name)
        if (run_dir / RUN_SPEC).is_file() and step_name is not None:
            return _run(src, str(run_dir.parent), run_dir.name, step_name, client)
        if (p / "config.json").is_file():
            place = LocalPlace(p)
            return TrainerSource(src, "orbax", p, _config(place, src), place)
        raise ConfigError(
            f"{src}: an Orbax checkpoint outside a run has no config.json",
            hint="convert the run folder instead, or put the model's "
            "config.json into the checkpoint folder",
        )
    if any(p.glob("*.safetensors")) or (p / "model.safetensors.index.json").is_file():
        place = LocalPlace(p)
        return HfSource(src, place, None, _config(place, src), place)
    raise ConfigError(f"{src!r} is not a checkpoint", hint=_EXPECTED)


def _open_gcs(src: str, step: int | None, client: Any) -> Source:
    place = open_place(src.rstrip("/"), client)
    if src.endswith(".safetensors"):
        parent_uri, _, name = src.rpartition("/")
        parent = open_place(parent_uri, client)
        return HfSource(src, parent, [name], _config(parent, parent_uri), parent)
    if place.exists(RUN_SPEC):
        root, _, name = src.rstrip("/").rpartition("/")
        return _run(src, root, name, step, client)
    if not place.exists():
        raise ConfigError(f"{src} does not exist (no objects under it)", hint=_EXPECTED)
    files = place.list()
    if TRAINER_MARKER in files and isinstance(place, GcsPlace):
        # TensorStore reads the OCDBT files from a local copy (each streamed to disk)
        local = Path(tempfile.mkdtemp(prefix="rlctl-trainer-"))
        for rel in files:
            (local / rel).parent.mkdir(parents=True, exist_ok=True)
            place.download(rel, local / rel)
        lp = LocalPlace(local)
        from rlctl.core.checkpoints.orbax import CHECKPOINT

        return _removing(
            TrainerSource(src, "trainer", local / CHECKPOINT, _config(lp, src), lp), local
        )
    if any(f.endswith(".safetensors") and "/" not in f for f in files):
        return HfSource(src, place, None, _config(place, src), place)
    raise ConfigError(f"{src} is not a checkpoint", hint=_EXPECTED)


def _gguf(path: Path) -> Source:
    """GGUF goes through the existing converter into a cached HF folder first (its
    quantised blocks dequantise per tensor; see gguf.py)."""
    from rlctl.core.checkpoints.gguf import convert_gguf_to_hf

    try:
        folder = convert_gguf_to_hf(path, Path(tempfile.mkdtemp(prefix="rlctl-gguf-")) / "hf")
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"{path}: not a readable GGUF file ({type(e).__name__})") from e
    place = LocalPlace(folder)
    return _removing(
        HfSource(str(path), place, None, _config(place, str(path)), place, kind="gguf"),
        folder.parent,
    )


def _removing(source: Source, scratch: Path) -> Source:
    """``source``, whose scratch folder is deleted once it is no longer used."""
    import shutil
    import weakref

    weakref.finalize(source, shutil.rmtree, str(scratch), True)
    return source


def _steps(steps: list[int]) -> str:
    return ", ".join(str(s) for s in steps)
