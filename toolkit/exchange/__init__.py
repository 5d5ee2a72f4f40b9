"""The toolkit's communication methods, written once over the array namespace: compression, error feedback, PowerSGD, DGC, local SGD, the clip and the NaN guard."""
