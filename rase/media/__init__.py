"""Media beside the text: images decoded, bounded and identified (image.py), then resized and
normalized as llama.cpp's libmtmd does before its vision encoders (preprocess.py)."""
