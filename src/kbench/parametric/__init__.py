"""Substrate P and every LoRA the project trains: the one LoRA routine, the agent base, the
injection recipe (what each adapter learns), its recall probes, and the adapter check.

The stages that write these models live in `kbench.stages` (agent_base, inject); the Optuna
search of injection strength is `kbench.parametric.calibration` (`kbench calibrate`).
"""

from kbench.parametric.adapters import (
    ADAPTER_DIRS,
    DISTRACTOR,
    GOLD,
    MERGED_DIR,
    TARGET,
    Injected,
    InjectionError,
    base_fingerprint,
    cell_adapter,
    cell_adapter_role,
    check_cell_adapter,
    check_injected,
    model_fingerprint,
)
from kbench.parametric.agent_base import AgentBaseError, agent_model_config, train_agent_base
from kbench.parametric.injection import record_conversations, train_injection, training_entities
from kbench.parametric.lora import Example, LoraError, LoraRun, tokenize_chat, train_lora
from kbench.parametric.recall import direct_recall, recall_metrics, summary_recall

__all__ = [
    "ADAPTER_DIRS",
    "DISTRACTOR",
    "GOLD",
    "MERGED_DIR",
    "TARGET",
    "AgentBaseError",
    "Example",
    "Injected",
    "InjectionError",
    "LoraError",
    "LoraRun",
    "agent_model_config",
    "base_fingerprint",
    "cell_adapter",
    "cell_adapter_role",
    "check_cell_adapter",
    "check_injected",
    "direct_recall",
    "model_fingerprint",
    "recall_metrics",
    "record_conversations",
    "summary_recall",
    "tokenize_chat",
    "train_agent_base",
    "train_injection",
    "training_entities",
    "train_lora",
]
