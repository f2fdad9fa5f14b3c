"""svc_trainer's TensorFlow runner (``runner``) and what it is made of."""
