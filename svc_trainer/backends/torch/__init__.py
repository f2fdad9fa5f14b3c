"""svc_trainer's PyTorch runner (``runner``) and what it is made of."""
