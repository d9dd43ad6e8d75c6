"""K-Bench: does LLM unlearning survive agentic deployment?"""

__version__ = "0.1.0"
