//! `Few`: a list kept on the stack while it holds at most `N` items, on the
//! heap beyond. A poll or select over a handful of descriptors, the common
//! call, then allocates nothing: an allocation and its free cost more
//! instructions than the rest of a short poll's bookkeeping, and the free
//! goes through the shim's own `free` hook.

pub enum Few<T, const N: usize> {
    Stack { items: [T; N], len: usize },
    Heap(Vec<T>),
}

impl<T: Clone, const N: usize> Few<T, N> {
    /// An empty list; `blank` fills the unused stack places (never read).
    pub fn new(blank: T) -> Self {
        Few::Stack {
            items: std::array::from_fn(|_| blank.clone()),
            len: 0,
        }
    }

    /// `capacity` items or fewer stay on the stack.
    pub fn with_capacity(capacity: usize, blank: T) -> Self {
        if capacity <= N {
            Few::new(blank)
        } else {
            Few::Heap(Vec::with_capacity(capacity))
        }
    }

    pub fn push(&mut self, item: T) {
        match self {
            Few::Stack { items, len } if *len < N => {
                items[*len] = item;
                *len += 1;
            }
            Few::Stack { items, len } => {
                let mut v = Vec::with_capacity(2 * N);
                v.extend(items[..*len].iter().cloned());
                v.push(item);
                *self = Few::Heap(v);
            }
            Few::Heap(v) => v.push(item),
        }
    }

    pub fn as_slice(&self) -> &[T] {
        match self {
            Few::Stack { items, len } => &items[..*len],
            Few::Heap(v) => v,
        }
    }

    pub fn as_mut_slice(&mut self) -> &mut [T] {
        match self {
            Few::Stack { items, len } => &mut items[..*len],
            Few::Heap(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_on_the_stack_and_past_it() {
        let mut f: Few<u32, 3> = Few::new(0);
        for i in 1..=2 {
            f.push(i);
        }
        assert!(matches!(f, Few::Stack { .. }));
        assert_eq!(f.as_slice(), [1, 2]);
        for i in 3..=7 {
            f.push(i);
        }
        assert!(matches!(f, Few::Heap(_)));
        assert_eq!(f.as_slice(), [1, 2, 3, 4, 5, 6, 7]);
        f.as_mut_slice()[0] = 9;
        assert_eq!(f.as_slice()[0], 9);
        let big: Few<u32, 3> = Few::with_capacity(4, 0);
        assert!(matches!(big, Few::Heap(_)));
    }
}
