"""TensorFlow: Keras 3 on Horovod (`session.py`), legacy tf-keras on Horovod (`tf_keras.py`),
TensorFlow's own strategies (`native.py`); what they share (`keras.py`: the Keras 3 session parts and
the `model.fit` pieces), the built-in models (`models.py`) and tf.data loading (`data.py`).

Imported only when framework=tensorflow is chosen (toolkit.registry), so `import toolkit` stays light.
"""
