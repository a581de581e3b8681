def build(:
    return None
