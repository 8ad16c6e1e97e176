"""Models as data and as transformers models: ``ModelConfig`` and the named shapes, the HF families fp8lab
converts, RoPE, a user's model folder and its checks. Imports ``core`` and ``records`` only."""
