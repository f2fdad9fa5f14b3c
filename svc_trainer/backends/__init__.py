"""The frameworks svc_trainer trains with, one package each (``torch``,
``tensorflow``), and what their multi-process strategies share: the local
process group (``launch``) and the line from Spark-launched ranks to their
driver (``spark_channel``)."""
